"""The planner's step-time model: its work counted by hand, each part at its rate, the power
cap's clock, the host floor, and the calibration's fit."""

import json
import math
from dataclasses import replace

import pytest

from tuneforge.hardware.step_rates import FITTED, H200, load_rates, step_rates
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import LoraShape, lora_params
from tuneforge.plan.calibration import Sample, fit_rates, sample_seconds
from tuneforge.plan.memory import Setup, kept_bytes_per_token
from tuneforge.plan.step_time import step_time
from tuneforge.plan.step_work import (
    ELEMENTWISE_PASSES,
    LOSS_BYTES_PER_LOGIT,
    StepWork,
    step_work,
)

DENSE = ModelArgs(
    dim=256, num_layers=4, num_heads=4, num_kv_heads=2, ffn_dim=512, vocab_size=1000,
    tie_embeddings=False,
)  # fmt: skip


def hand_rates(**changes) -> object:
    """Round rates, no clock throttling, so that each part is checked by hand."""
    rates = replace(
        H200, name="hand", bf16_tflops=100.0, fp8_tflops=200.0, expert_tflops=50.0,
        attention_tflops=25.0, memory_gbps=1000.0, host_link_gbps=10.0, dequant_gbps=500.0,
        host_s_per_block=0.0, step_s=0.0, chunk_s=0.0, replicated_collectives=0.5,
        sharded_collectives=2.0, power_limit=1.0, light_power=1.0, adapter_share=0.5,
    )  # fmt: skip
    return replace(rates, **changes)


def test_full_fine_tuning_counts_three_passes_of_every_product_and_attention():
    setup = Setup(DENSE, 2, 1024, compiled=True)
    work = step_work(setup, [[512, 512]])
    tokens = 1024
    q, kv = DENSE.num_heads * DENSE.head_dim, DENSE.num_kv_heads * DENSE.head_dim
    # 2 FLOPs a weight (the norms' weights counted too, as the cost formulas count them)
    block = 2 * (DENSE.dim * (2 * q + 2 * kv) + 3 * DENSE.dim * DENSE.ffn_dim + 2 * DENSE.dim)
    head = 2 * DENSE.vocab_size * DENSE.dim + 2 * DENSE.dim
    assert work.gemm_flops == {
        "bf16": pytest.approx(3 * tokens * (DENSE.num_layers * block + head))
    }
    # causal attention of two 512-token documents: (L + 1) / 2 keys a token, q·k and p·v
    per_key = 2 * DENSE.num_heads * (DENSE.head_dim + DENSE.head_dim)
    forward = 2 * 512 * per_key * (512 + 1) / 2 * DENSE.num_layers
    assert work.attention_flops == pytest.approx(3 * forward)
    kept = sum(kept_bytes_per_token(setup, layer, "none") for layer in range(4)) * tokens
    loss = tokens * DENSE.vocab_size * LOSS_BYTES_PER_LOGIT
    # pure bf16 AdamW: weight, m and v read and written, the gradient read and zeroed
    optimizer = DENSE.num_params() * (2 * (2 + 2 + 2) + 2 * 2)
    assert work.memory_bytes == pytest.approx(kept * ELEMENTWISE_PASSES + loss + optimizer)
    assert work.loss_chunks == 1 and work.blocks_launched == 4


def test_lora_counts_two_passes_of_the_base_and_its_adapters_at_their_share():
    lora = LoraShape(8)
    setup = Setup(DENSE, 2, 1024, lora=lora, compiled=True)
    work = step_work(setup, [[1024]])
    adapters = 2 * lora_params(DENSE, lora, active=True) * 3 * 1024
    assert work.gemm_flops["adapters"] == pytest.approx(adapters)
    full = step_work(Setup(DENSE, 2, 1024, compiled=True), [[1024]])
    assert work.gemm_flops["bf16"] == pytest.approx(full.gemm_flops["bf16"] * 2 / 3)
    rates = hand_rates()
    time = step_time(work, rates)
    assert time.parts["gemm adapters"] == pytest.approx(adapters / (50e12))
    assert time.parts["gemm bf16"] == pytest.approx(work.gemm_flops["bf16"] / 100e12)
    assert time.parts["attention"] == pytest.approx(work.attention_flops / 25e12)
    assert time.parts["memory"] == pytest.approx(work.memory_bytes / 1000e9)


def test_full_checkpointing_runs_every_block_forward_again():
    plain = step_work(Setup(DENSE, 2, 1024, compiled=True), [[1024]])
    again = step_work(Setup(DENSE, 2, 1024, checkpointing="full", compiled=True), [[1024]])
    head = 2 * DENSE.vocab_size * DENSE.dim * 1024
    blocks = plain.gemm_flops["bf16"] / 3 - head
    assert again.gemm_flops["bf16"] - plain.gemm_flops["bf16"] == pytest.approx(blocks)
    assert again.attention_flops == pytest.approx(plain.attention_flops * 4 / 3)


def test_fp8_products_and_the_dequantised_base_are_priced_apart():
    fp8 = step_work(Setup(DENSE, 2, 1024, lora=LoraShape(8), compiled=True), [[1024]], fp8="e4m3")
    head = 2 * DENSE.vocab_size * DENSE.dim * 1024
    assert fp8.gemm_flops["bf16"] == pytest.approx(2 * head)  # the output layer stays
    assert fp8.gemm_flops["fp8"] > 0
    time = step_time(fp8, hand_rates())
    assert time.parts["gemm fp8"] == pytest.approx(fp8.gemm_flops["fp8"] / 200e12)


def test_an_fp8_implementation_runs_at_its_share_of_the_fp8_rate():
    work = StepWork(gemm_flops={"fp8": 200e12}, compiled=True)
    rates = hand_rates(fp8_kernels=(("torchao rowwise", 0.5),))
    assert step_time(work, rates).parts["gemm fp8"] == pytest.approx(1.0)
    torchao = replace(work, fp8_kernel="torchao rowwise")
    assert step_time(torchao, rates).parts["gemm fp8"] == pytest.approx(2.0)


def test_cudnn_attention_pays_for_each_block_restored_from_host_memory():
    setup = Setup(DENSE, 2, 1024, lora=LoraShape(8), compiled=True, offload_activations=2)
    work = step_work(setup, [[1024], [1024]], attention_kernel="cudnn")
    assert work.restored_blocks == 2 * 2  # two blocks, two micro-batches
    rates = hand_rates(cudnn_restored_block_s=0.01)
    assert step_time(work, rates).parts["cudnn restores"] == pytest.approx(0.04)
    flash = step_time(replace(work, attention_kernel="flash"), rates)
    assert "cudnn restores" not in flash.parts


def test_products_on_a_dequantised_four_bit_base_draw_less_power():
    rates = hand_rates(power_limit=0.8, light_power=1.0, four_bit_gemm_power=0.9)
    products = StepWork(gemm_flops={"bf16": 100e12}, compiled=True)
    assert step_time(products, rates).clock == pytest.approx(0.8)
    four_bit = step_time(replace(products, dequant_bytes=1.0), rates)
    assert four_bit.clock == pytest.approx(0.8 / 0.9)


def test_a_compiled_block_over_a_four_bit_base_keeps_two_widths_a_token():
    from tuneforge.plan.base_weights import BaseWeights
    from tuneforge.plan.memory import FOUR_BIT_COMPILED_WIDTHS

    lora = LoraShape(8)
    bf16 = Setup(DENSE, 2, 1024, lora=lora, compiled=True)
    nf4 = replace(bf16, base_weights=BaseWeights("bnb-nf4"))
    widths = FOUR_BIT_COMPILED_WIDTHS * DENSE.dim * 2 + DENSE.num_heads * 4
    assert kept_bytes_per_token(nf4, 0, "none") == widths
    assert kept_bytes_per_token(bf16, 0, "none") > widths
    assert kept_bytes_per_token(nf4, 0, "full") == kept_bytes_per_token(bf16, 0, "full")


def test_host_transfers_count_only_what_the_compute_does_not_hide():
    work = StepWork(
        gemm_flops={"bf16": 100e12 * 0.1}, host_bytes=(2e9, 0.5e9), forward_share=0.5,
        compiled=True,
    )  # fmt: skip
    time = step_time(work, hand_rates())
    # 0.1 s of products, half of it forward: 0.2 s out against 0.05 s, 0.05 s back hidden
    assert time.parts["host transfers"] == pytest.approx(0.2 - 0.05)
    assert time.total_s == pytest.approx(0.1 + 0.15)


def test_collectives_are_priced_by_kind():
    work = StepWork(
        collective_bytes={"ddp all-reduce": 45e9, "fsdp all-gather": 45e9, "tp all-reduce": 45e9},
        compiled=True,
    )  # fmt: skip
    time = step_time(work, hand_rates(), link_gbps=450.0)
    assert time.parts["collective ddp all-reduce"] == pytest.approx(0.1 * 0.5)
    assert time.parts["collective fsdp all-gather"] == pytest.approx(0.1 * 2.0)
    assert time.parts["collective tp all-reduce"] == pytest.approx(0.1)  # in line


def test_the_power_cap_holds_the_clock_under_products_and_lets_it_rise_under_light_work():
    rates = hand_rates(power_limit=0.8, light_power=0.5)
    products = step_time(StepWork(gemm_flops={"bf16": 100e12}, compiled=True), rates)
    assert products.clock == pytest.approx(0.8)
    assert products.total_s == pytest.approx(1.0 / 0.8)
    light = step_time(StepWork(memory_bytes=1000e9, compiled=True), rates)
    assert light.clock == 1.0 and light.total_s == pytest.approx(1.0)
    half = step_time(StepWork(gemm_flops={"bf16": 50e12}, memory_bytes=500e9, compiled=True), rates)
    assert half.clock == pytest.approx(min(1.0, 0.8 / 0.75))


def test_the_host_floor_bounds_a_step_unless_it_is_captured():
    rates = hand_rates(host_s_per_block=0.01, step_s=0.002)
    work = StepWork(gemm_flops={"bf16": 1e12}, blocks_launched=8, compiled=True)
    time = step_time(work, rates)
    assert time.host_s == pytest.approx(8 * 0.01 + 0.002)
    assert time.total_s == pytest.approx(time.host_s) and time.bound == "host"
    eager = step_time(replace(work, compiled=False), rates)
    assert eager.host_s == pytest.approx(8 * 0.01 * rates.eager_launch + 0.002)
    captured = step_time(replace(work, captured=True), rates)
    assert captured.host_s == pytest.approx(0.002) and captured.bound == "gemm bf16"


def test_the_fit_recovers_the_rates_that_made_the_measurements():
    """Steps priced with known rates: the fit, started elsewhere, finds rates that predict them
    exactly, and recovers the rates the measurements separate."""
    truth = replace(
        H200, bf16_tflops=500.0, memory_gbps=2000.0, attention_tflops=300.0, power_limit=1.0,
        light_power=1.0, host_s_per_block=0.0,
    )  # fmt: skip
    samples = []
    for index, (gemm, attention, memory) in enumerate(
        [(1e14, 1e13, 2e10), (2e14, 5e12, 1e10), (5e13, 2e13, 4e10), (1.5e14, 1e13, 3e10),
         (8e13, 3e12, 5e10), (3e14, 1.5e13, 2.5e10)]
    ):  # fmt: skip
        work = StepWork(
            gemm_flops={"bf16": gemm}, attention_flops=attention, memory_bytes=memory,
            compiled=True,
        )  # fmt: skip
        samples.append(Sample(f"s{index}", [[work]], step_time(work, truth).total_s))
    start = replace(truth, bf16_tflops=700.0, memory_gbps=3000.0, attention_tflops=200.0)
    fitted = fit_rates(samples, start, "fitted", prior_weight=1e-8)
    for sample in samples:
        assert sample_seconds(sample, fitted) == pytest.approx(sample.seconds, rel=0.01)
    assert fitted.bf16_tflops == pytest.approx(500.0, rel=0.02)
    assert fitted.memory_gbps == pytest.approx(2000.0, rel=0.05)
    assert fitted.attention_tflops == pytest.approx(300.0, rel=0.05)
    assert fitted.name == "fitted"


def test_a_sample_waits_for_its_slowest_rank_each_step():
    slow = StepWork(gemm_flops={"bf16": 2e14}, compiled=True)
    fast = StepWork(gemm_flops={"bf16": 1e14}, compiled=True)
    rates = hand_rates()
    sample = Sample("two ranks", [[slow, fast], [fast, fast]], 1.0)
    assert sample_seconds(sample, rates) == pytest.approx((2.0 + 1.0) / 2)


def test_rates_are_saved_and_read_back_and_a_foreign_file_is_refused(tmp_path):
    file = tmp_path / "rates.json"
    fitted = replace(H200, name="mine", bf16_tflops=123.0)
    fitted.save(file)
    assert load_rates(file) == fitted
    (tmp_path / "bad.json").write_text(json.dumps({"bf16_tflops": 1.0}))
    with pytest.raises(ValueError, match="written by `tuneforge plan --calibrate`"):
        load_rates(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(ValueError, match="not a calibration file"):
        load_rates(tmp_path / "junk.json")


def test_another_gpu_scales_the_fitted_rates_by_its_spec_sheet():
    h100 = step_rates("NVIDIA H100 80GB HBM3")
    assert h100.bf16_tflops == pytest.approx(H200.bf16_tflops)  # the same tensor cores
    assert h100.memory_gbps == pytest.approx(H200.memory_gbps * 3350 / 4800)
    mi250x = step_rates("MI250X")
    assert mi250x.bf16_tflops == pytest.approx(H200.bf16_tflops * 191.5 / 989.4)
    assert all(getattr(h100, key) > 0 for key in FITTED)
    assert math.isclose(h100.host_s_per_block, H200.host_s_per_block)
