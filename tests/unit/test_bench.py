"""The benchmark's pieces that need no GPU: its batches, its plan of runs, its ratios."""

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tuneforge.bench.batches import synthetic_batch
from tuneforge.bench.report import ratios
from tuneforge.bench.runner import Run, needs_fp8, plan_runs
from tuneforge.bench.workloads import WORKLOADS
from tuneforge.data.packing import IGNORE_INDEX


def test_packed_batch_fills_the_step_with_log_normal_documents():
    batch = synthetic_batch(1000, 4096, one_document=False, seed=0)
    lengths = batch.packed.lengths()
    assert sum(lengths) == batch.tokens.numel() == 4096 and batch.num_padding == 0
    assert len(lengths) > 2 and len(set(lengths)) > 1
    ends = np.cumsum(lengths) - 1
    assert (batch.labels[ends] == IGNORE_INDEX).all()  # no target across a document's end
    assert batch.num_loss_tokens == 4096 - len(lengths)
    inside = np.setdiff1d(np.arange(4095), ends)
    assert (batch.labels[inside] == batch.tokens[inside + 1]).all()
    assert synthetic_batch(1000, 4096, one_document=True, seed=0).packed.lengths() == [4096]


def test_plan_runs_peers_per_workload():
    runs = plan_runs([WORKLOADS["qwen3-moe-4l-lora-attn-experts"]], ["hf+peft", "unsloth"])
    systems = {run.system for run in runs}
    assert systems == {"tuneforge", "hf+peft"}  # Unsloth adapts modules, not expert banks
    runs = plan_runs([WORKLOADS["llama3.2-1b-full-fsdp2-2gpu"]], ["hf+peft"])
    workload = WORKLOADS["llama3.2-1b-full-fsdp2-2gpu"]
    assert [run.variant for run in runs] == [
        "compiled+1gpu",
        "compiled+samedata+1gpu",
        "compiled+accum4+1gpu",
        "compiled+tokens16384+1gpu",
        *workload.variants,
    ]


def test_runs_needing_more_gpus_than_there_are_are_left_out_with_a_note():
    from tuneforge.bench.runner import Run, run_gpus

    assert run_gpus(Run("llama3.2-1b-full-fsdp2-2gpu", "tuneforge", "compiled+ddp")) == 2
    assert run_gpus(Run("llama3.2-1b-full-fsdp2-2gpu", "tuneforge", "compiled+1gpu")) == 1
    assert run_gpus(Run("llama3-8b-lora", "hf+peft")) == 1


def test_ddp_runs_where_there_are_several_gpus_or_a_process_group():
    from tuneforge.bench.ours import strategy_for
    from tuneforge.bench.workloads import Variant
    from tuneforge.parallel.distributed import Dist

    ddp, plain = Variant.parse("compiled+ddp"), Variant.parse("compiled")
    assert strategy_for(ddp, Dist(world_size=2)) == "ddp"
    assert strategy_for(plain, Dist(world_size=2)) == "fsdp"
    assert strategy_for(ddp, Dist()) == strategy_for(plain, Dist()) == "single"  # no group here


def test_a_mesh_variant_configures_the_mesh_on_several_gpus_and_scales_against_one():
    from tuneforge.bench.ours import workload_config
    from tuneforge.bench.workloads import WORKLOADS, Variant, baseline_variant
    from tuneforge.parallel.distributed import Dist

    workload = WORKLOADS["qwen3-moe-4l-lora-attn-experts-4gpu"]
    assert "compiled+ep4" in workload.variants
    config = workload_config(workload, Variant.parse("compiled+tp2+ep2"), Dist(world_size=4))
    parallel = config.parallel
    assert (parallel.strategy, parallel.tensor_parallel, parallel.expert_parallel) == (
        "fsdp", 2, 2,
    )  # fmt: skip
    alone = workload_config(workload, Variant.parse("compiled+ep2"), Dist())
    assert alone.parallel.expert_parallel == 1  # one GPU standing in for the work
    assert baseline_variant("compiled+tp2+accum4") == "compiled+accum4"


def test_scaling_compares_each_multi_gpu_run_with_one_gpu_doing_the_same_work_per_gpu():
    """The baseline keeps the options that change a GPU's work (micro-batches per step, which
    batches) and drops how the GPUs share it; a round's run is compared within its round."""
    from tuneforge.bench.report import scaling
    from tuneforge.bench.workloads import baseline_variant

    assert baseline_variant("compiled+ddp+nccl8") == "compiled"
    assert baseline_variant("compiled+zero2+bf16reduce+nccl8+accum4") == "compiled+accum4"
    assert baseline_variant("compiled+ddp+samedata") == "compiled+samedata"
    assert baseline_variant("compiled+ddp+tokens16384+nccl4") == "compiled+tokens16384"

    def run(variant, speed, gpus=2, round_=1):
        single = variant.endswith("+1gpu")
        return {"workload": "w", "system": "tuneforge", "variant": variant.removesuffix("+1gpu"),
                "variant_run": variant, "tokens_per_s": speed, "gpus": 1 if single else gpus,
                "round": round_}  # fmt: skip

    results = [
        run("compiled+ddp", 180.0),
        run("compiled+ddp+accum4", 190.0),
        run("compiled+1gpu", 100.0),
        run("compiled+accum4+1gpu", 100.0),
        run("compiled+ddp", 150.0, round_=2),
        run("compiled+1gpu", 80.0, round_=2),
        {"workload": "w", "system": "tuneforge", "variant": "compiled+ddp+samedata", "error": "x"},
        run("compiled+ddp+nccl8", 160.0, round_=3),  # its round's one-GPU run failed
    ]
    rows = scaling(results)
    assert [(r["variant"], r["round"], r["efficiency"]) for r in rows] == [
        ("compiled+ddp", 1, 0.9),
        ("compiled+ddp+accum4", 1, 0.95),
        ("compiled+ddp", 2, 150.0 / 160.0),
        ("compiled+ddp+nccl8", 3, None),
    ]


def test_ratios_compare_with_hf_and_the_fastest_peer():
    results = [
        {"workload": "w", "system": "hf+peft", "tokens_per_s": 100.0},
        {"workload": "w", "system": "unsloth", "tokens_per_s": 200.0},
        {"workload": "w", "system": "tuneforge", "tokens_per_s": 300.0},
        {"workload": "w", "system": "tuneforge", "error": "exit 1"},
    ]
    assert ratios(results) == [(None, None), (None, None), (3.0, 1.5), (None, None)]


def test_rounds_compare_within_a_round_and_give_each_run_its_spread():
    """Two rounds on a machine that drifted: each round's tuneforge run is compared with that
    round's peer; over the rounds each run gets its median and range, a failed round left out."""
    from tuneforge.bench.report import over_rounds

    results = [
        {"workload": "w", "system": "unsloth", "tokens_per_s": 200.0, "round": 1},
        {"workload": "w", "system": "tuneforge", "variant": "a", "tokens_per_s": 300.0, "round": 1},
        {"workload": "w", "system": "unsloth", "tokens_per_s": 100.0, "round": 2},
        {"workload": "w", "system": "tuneforge", "variant": "a", "tokens_per_s": 200.0, "round": 2},
        {"workload": "w", "system": "tuneforge", "variant": "a", "error": "OOM", "round": 3},
    ]
    assert [vs_best for _, vs_best in ratios(results)] == [None, 1.5, None, 2.0, None]
    unsloth, ours = over_rounds(results)
    assert unsloth["median_tokens_per_s"] == 150.0 and unsloth["rounds"] == 2
    assert ours == {
        "workload": "w",
        "system": "tuneforge",
        "variant": "a",
        "rounds": 2,
        "median_tokens_per_s": 250.0,
        "lowest": 200.0,
        "highest": 300.0,
    }


def test_a_grpo_workload_samples_its_groups_and_trl_reads_the_same_prompts():
    """Our side on a tiny shape: each step's prompts answered `generations` times with exactly
    `completion_tokens` tokens, sampling timed apart from training; TRL's records tokenise to the
    same prompts, token for token, in the order our side reads them."""
    from tuneforge.bench.batches import prompt_token_ids, synthetic_prompts
    from tuneforge.bench.ours import run_ours
    from tuneforge.bench.peers_trl_grpo import prompt_records
    from tuneforge.bench.word_tokenizer import word_tokenizer
    from tuneforge.bench.workloads import ALL_LINEAR, Workload

    grpo = WORKLOADS["llama3-8b-lora-grpo"]
    assert {run.system for run in plan_runs([grpo], ["hf+peft", "unsloth", "trl"])} == {
        "tuneforge",
        "trl",
    }
    workload = Workload(
        "tiny-grpo", "demo-tiny", ALL_LINEAR, tokens=12, objective="grpo", prompts=2,
        generations=3, completion_tokens=5,
    )  # fmt: skip
    ours = run_ours(workload, "eager", warmup=1, steps=2)
    assert ours["tokens_per_step"] == 2 * 3 * (12 + 5) and ours["documents_per_step"] == 6
    assert 0 < ours["sampling_s"] < ours["ms_per_step"] / 1e3
    assert ours["sampled_tokens_per_s"] == pytest.approx(2 * 3 * 5 / ours["sampling_s"])
    # the planner's part for the same shape, on this machine's rates, beside the measurement
    from tuneforge.models.api import model_args
    from tuneforge.plan.prediction import CPU, Hardware
    from tuneforge.plan.sampling_time import sampling_seconds

    rates = Hardware(gpu=CPU).step_rates
    predicted = sampling_seconds(model_args("demo-tiny"), [12, 12], 3, 5, 4, rates)
    assert ours["predicted_sampling_s"] == pytest.approx(predicted) and predicted > 0
    tokenizer = word_tokenizer(512, str(Path(tempfile.mkdtemp())))
    records = prompt_records(workload, 512, 8)
    for step in range(8):
        batch = synthetic_prompts(512, 2, 12, (step % 4) * 100)
        for slot in range(2):
            ids = tokenizer(records[2 * step + slot]["prompt"], add_special_tokens=False)
            expected = prompt_token_ids(512, 12, (step % 4) * 100 + slot)
            assert ids["input_ids"] == expected
            cu = batch.packed.cu_seqlens.tolist()
            assert batch.tokens[cu[slot] : cu[slot] + 12].tolist() == expected


@pytest.mark.slow
def test_tuneforge_and_hf_peft_runners_measure_the_same_step_on_a_cpu():
    """The runners end to end on a tiny shape (the benchmark itself needs a GPU): both report
    the step's tokens and FLOPs from the same cost formulas, and times."""
    from tuneforge.bench.ours import run_ours
    from tuneforge.bench.peers import run_hf
    from tuneforge.bench.workloads import ALL_LINEAR, Workload

    workload = Workload("tiny", "demo-tiny", ALL_LINEAR, tokens=1024)
    ours = run_ours(workload, "eager", warmup=1, steps=2)
    peer = run_hf(workload, liger=False, checkpointing=False, warmup=1, steps=2)
    for result in (ours, peer):
        assert result["tokens_per_step"] == 1024 and result["ms_per_step"] > 0
    # ours cycles through 4 packed batches of different costs: timed in whole cycles
    assert len(ours["ms_per_step_all"]) == ours["steps"] == 4
    assert len(peer["ms_per_step_all"]) == 2
    assert ours["system"] == "tuneforge" and peer["system"] == "hf+peft"
    # one 1,024-token document costs more attention than packed documents of the same tokens
    assert peer["flops_per_step"] > ours["flops_per_step"] > 0
    assert ours["documents_per_step"] >= 1


def test_a_dpo_workload_trains_pairs_and_is_measured_against_trl_only():
    """Its peer is TRL, never the SFT peers (and TRL is never run on an SFT workload); each step
    is one pair whose two documents share a prompt and are supervised on their replies only."""
    from tuneforge.bench.batches import pair_token_ids, synthetic_pair

    dpo = WORKLOADS["llama3-8b-lora-dpo"]
    peers = ["hf+peft", "unsloth", "trl"]
    assert {run.system for run in plan_runs([dpo], peers)} == {"tuneforge", "trl"}
    assert "trl" not in {run.system for run in plan_runs([WORKLOADS["llama3-8b-lora"]], peers)}
    for index in range(4):
        prompt, chosen, rejected = pair_token_ids(1000, 4096, index)
        assert len(prompt) + len(chosen) == len(prompt) + len(rejected) == 2048
        assert chosen[-1] == rejected[-1] == 3 and min(prompt + chosen[:-1] + rejected[:-1]) >= 4
        batch = synthetic_pair(1000, 4096, index)
        assert batch.packed.lengths() == [2048, 2048]
        supervised = batch.labels[batch.labels != IGNORE_INDEX].tolist()
        assert supervised == chosen + rejected and batch.num_loss_tokens == 2 * len(chosen)


def test_tuneforge_runs_a_dpo_workload_and_trl_sees_the_same_pairs_on_a_cpu():
    """Our side end to end on a tiny shape (a pair a step, the reference's forward counted in
    the FLOPs); TRL's trainer, built as the GPU run builds it, tokenises the same pairs token for
    token (its training needs Triton: the GPU run)."""
    from tuneforge.bench.ours import run_ours
    from tuneforge.bench.workloads import ALL_LINEAR, Workload

    workload = Workload("tiny-dpo", "demo-tiny", ALL_LINEAR, tokens=512, objective="dpo")
    sft = run_ours(replace(workload, objective="sft"), "eager+onedoc", warmup=1, steps=1)
    ours = run_ours(workload, "eager", warmup=1, steps=2)
    assert ours["documents_per_step"] == 2 and ours["tokens_per_step"] == 512
    assert ours["flops_per_step"] > sft["flops_per_step"] * 1.2  # the reference's forward
    pytest.importorskip("trl", reason="TRL (the DPO peer) is not installed here")
    from tuneforge.bench.peers_trl import check_same_pairs, trl_trainer

    trainer = trl_trainer(workload, checkpointing=False, steps=4)
    vocab_size = trainer.model.config.vocab_size
    check_same_pairs(trainer.train_dataset, vocab_size, 512)
    with pytest.raises(RuntimeError, match="differently"):
        check_same_pairs(trainer.train_dataset, vocab_size, 256)


@pytest.mark.slow
def test_one_gpu_standing_in_for_two_trains_on_both_ranks_batches_a_step_of_micro_batches():
    """The one-GPU baseline of a two-GPU workload cycles through both ranks' batches (the work
    they share), in whole cycles of micro-batches; with samedata every rank has rank 0's; with
    balanced the ranks share the same batches, dealt so that a step waits less for its slower
    rank."""
    from tuneforge.bench.ours import batch_seeds, rank_batches, run_ours, whole_cycles
    from tuneforge.bench.workloads import Variant, Workload
    from tuneforge.data.rank_balance import attention_cost
    from tuneforge.parallel.distributed import Dist

    assert batch_seeds(0, 1, 2, same_data=False) == [0, 100, 1, 101, 2, 102, 3, 103]
    assert batch_seeds(1, 2, 2, same_data=False) == [100, 101, 102, 103]
    assert batch_seeds(1, 2, 2, same_data=True) == batch_seeds(0, 1, 1, False) == [0, 1, 2, 3]
    assert whole_cycles(5, batches=8) == 8 and whole_cycles(5, batches=4, micro_batches=4) == 5
    assert whole_cycles(3, batches=8, micro_batches=4) == 4

    balanced, plain = Variant.parse("eager+balanced"), Variant.parse("eager")
    ranks = [rank_batches(1000, 4096, balanced, Dist(rank, 2), 2) for rank in range(2)]
    one_gpu = rank_batches(1000, 4096, balanced, Dist(), 2)  # every rank's, as without balance

    def lengths(batches):
        return sorted(tuple(batch.packed.lengths()) for batch in batches)

    assert lengths(one_gpu) == lengths(rank_batches(1000, 4096, plain, Dist(), 2))

    assert lengths(ranks[0] + ranks[1]) == lengths(one_gpu)

    def waited(ranks):  # each step's costlier batch, summed
        return sum(
            max(attention_cost(a.packed.lengths()), attention_cost(b.packed.lengths()))
            for a, b in zip(*ranks, strict=True)
        )

    unbalanced = [rank_batches(1000, 4096, plain, Dist(rank, 2), 2) for rank in range(2)]
    assert waited(ranks) < waited(unbalanced)

    workload = Workload("tiny-2gpu", "demo-tiny", None, tokens=512, gpus=2)
    one = run_ours(workload, "eager+accum2", warmup=1, steps=1)
    assert one["steps"] == 4  # 8 batches, 2 a step
    assert one["tokens_per_step"] == 1024 and one["gpus"] == 1
    assert run_ours(workload, "eager+tokens256", warmup=1, steps=1)["tokens_per_step"] == 256
    single = run_ours(Workload("tiny", "demo-tiny", None, tokens=512), "eager", warmup=1, steps=1)
    assert one["flops_per_step"] > single["flops_per_step"]
    assert single["precision"] == []
    # full fine-tuning's linears go FP8 too (CPU torch has `_scaled_mm`), and the results say so
    fp8 = run_ours(Workload("tiny", "demo-tiny", None, tokens=512), "eager+fp8", warmup=1, steps=1)
    assert any("(trained): FP8" in line for line in fp8["precision"]), fp8["precision"]


def test_variant_names_parse_into_settings_and_typos_are_refused():
    from tuneforge.bench.workloads import Variant
    from tuneforge.errors import TuneforgeError

    variant = Variant.parse("compiled+full+offload+budget0.8+chunk512")
    assert variant.compiled and variant.checkpointing == "full" and variant.offload
    assert variant.memory_budget == 0.8 and variant.loss_chunk_tokens == 512
    assert Variant.parse("eager") == Variant(compiled=False)
    assert Variant.parse("compiled+full+host10").offload_activations == 10
    assert Variant.parse("compiled+full+host10+keep2").keep_activations == 2
    assert Variant.parse("compiled+zero2+nccl8").nccl_max_channels == 8
    assert Variant.parse("compiled+varlen").attention == "varlen"
    assert Variant.parse("compiled").attention == "auto"
    assert Variant.parse("compiled+ddp+accum4+samedata") == Variant(
        compiled=True, ddp=True, grad_accum_steps=4, same_data=True
    )
    assert Variant.parse("compiled+graph+autotune") == Variant(
        compiled=True, cuda_graph=True, autotune=True
    )
    assert Variant.parse("compiled+tp2+ep4") == Variant(
        compiled=True, tensor_parallel=2, expert_parallel=4
    )
    torchao = Variant.parse("compiled+fp8+tensorwise+torchao").precision()
    assert torchao.fp8_implementation == "torchao" and torchao.fp8_scaling == "tensorwise"
    for bad in (
        "compiled+torchao",
        "compiled+offlaod",
        "fast",
        "compiled+budget2",
        "compiled+chunkX",
        "eager+hostX",
        "compiled+ncclX",
        "compiled+accum0",
        "compiled+samedate",
        "compiled+tokens0",
    ):
        with pytest.raises(TuneforgeError, match="variant"):
            Variant.parse(bad)


def test_bench_refuses_a_bad_variant_before_looking_for_a_gpu():
    from tests.cli_runs import assert_clean_failure, run_cli

    result = run_cli("bench", "--variant", "compiled+offlaod")
    assert_clean_failure(result, "unknown option 'offlaod'")


def test_a_run_over_its_time_limit_is_stopped_and_reported():
    from tuneforge.bench.runner import Run, execute

    result = execute(Run("llama3.2-1b-lora", "tuneforge", "eager"), 1, 1, limit_s=0.5)
    assert result["error"] == "stopped after the 0.5 s limit per run"
    assert result["workload"] == "llama3.2-1b-lora"


def test_a_profiled_result_is_printed_against_the_unprofiled_step(monkeypatch):
    """The kernels' time is compared with the step measured without the profiler (whose own
    wall time it inflates); the host's most expensive operators follow."""
    from rich.console import Console

    from tuneforge.cli import bench as cli_bench

    console = Console(record=True, width=120)
    monkeypatch.setattr(cli_bench, "console", console)
    profile = {
        "gpu_busy_ms_per_step": 25.0,
        "wall_ms_per_step": 75.0,
        "top_kernels": [{"kernel": "nvjet_gemm", "ms_per_step": 6.1, "calls_per_step": 4}],
        "top_host_ops": [
            {"op": "tuneforge::matmul_add_low_rank", "host_ms_per_step": 2.0, "calls_per_step": 29}
        ],
    }
    result = {"tokens_per_s": 4096 / 0.03, "ms_per_step": 30.0, "peak_alloc_gib": 8.0, "mfu": 0.3}
    cli_bench._print_line(result | {"peak_reserved_gib": 9.5, "profile": profile})
    text = console.export_text()
    assert "peak 8.00 GiB allocated, 9.50 reserved" in text
    assert "kernels 25.0 ms per step (83%)" in text
    assert "nvjet_gemm" in text and "tuneforge::matmul_add_low_rank" in text

    # several ranks: each one's timeline (one waiting for the other shows exposed collectives)
    spans = {"compute": 70.0, "collectives": 9.0, "exposed_collectives": 1.0, "idle": 2.0}
    waiting = spans | {"exposed_collectives": 6.5}
    ranks = profile | {"timeline": spans, "timeline_by_rank": [spans, waiting]}
    cli_bench._print_line(result | {"peak_reserved_gib": 9.5, "profile": ranks})
    text = console.export_text()
    assert "rank 0 timeline per step: compute 70.0 ms, collectives 9.0 ms (1.0 ms" in text
    assert "rank 1 timeline per step: compute 70.0 ms, collectives 9.0 ms (6.5 ms" in text


def test_allocator_retries_are_counted_over_the_timed_steps_and_printed(monkeypatch):
    """The allocator's counters are read before and after the timed steps: a retry during
    warm-up does not count, one per timed step reads 1 per step, and the line says so."""
    from rich.console import Console

    from tuneforge.bench import timing
    from tuneforge.cli import bench as cli_bench
    from tuneforge.train.device_watch import ALLOCATOR_COUNTS

    counts = {name: 0 for name in ALLOCATOR_COUNTS}

    def step():
        counts["num_alloc_retries"] += 1

    monkeypatch.setattr(timing, "allocator_counts", lambda: dict(counts))
    result = timing.time_steps(step, warmup=3, steps=4)
    assert result["allocator_per_step"]["num_alloc_retries"] == 1
    assert result["allocator_per_step"]["num_device_alloc"] == 0

    console = Console(record=True, width=120)
    monkeypatch.setattr(cli_bench, "console", console)
    line = {"tokens_per_s": 1.0, "ms_per_step": 1.0, "peak_alloc_gib": 1.0, "mfu": 0.1}
    cli_bench._print_line(line | {"peak_reserved_gib": 1.0} | result)
    assert "1 allocator retries per step" in console.export_text()


def test_a_stalled_step_is_named(monkeypatch):
    """One of twelve steps at four times the others: printed, since the mean counts it."""
    from rich.console import Console

    from tuneforge.cli import bench as cli_bench

    console = Console(record=True, width=120)
    monkeypatch.setattr(cli_bench, "console", console)
    line = {"tokens_per_s": 1.0, "ms_per_step": 1.0, "peak_alloc_gib": 1.0, "mfu": 0.1,
            "peak_reserved_gib": 1.0, "ms_per_step_median": 100.0}  # fmt: skip
    cli_bench._print_line(line | {"ms_per_step_all": [100.0] * 11 + [403.2]})
    assert "one step took 403.2 ms, 4.0x the median" in console.export_text()
    cli_bench._print_line(line | {"ms_per_step_all": [100.0] * 11 + [180.0]})
    assert "180.0 ms" not in console.export_text()


def test_the_step_time_is_the_mean_so_that_tokens_per_second_is_tokens_over_their_time():
    """Steps of different costs (packed batches): the mean, not the median, gives the time the
    tokens took; the median is kept beside it."""
    import time

    from tuneforge.bench import timing

    costs = iter([0.0] + [0.01, 0.01, 0.01, 0.05] * 2)  # one warm-up step, then two cycles

    def step():
        time.sleep(next(costs))

    result = timing.time_steps(step, warmup=1, steps=8)
    assert result["ms_per_step"] == pytest.approx(20.0, abs=4.0)  # (3 x 10 + 50) / 4 ms
    assert result["ms_per_step_median"] == pytest.approx(10.0, abs=4.0)


def test_clock_and_power_are_summarised_as_medians_with_the_share_held_down():
    from tuneforge.bench.gpu_clocks import summarise
    from tuneforge.hardware.nvml import Sample

    samples = [Sample(1000, 600, 0x4), Sample(1500, 700, 0x0), Sample(2000, 650, 0x4 | 0x40)]
    summary = summarise(samples, max_sm_clock_mhz=1980, power_limit_w=700)
    assert summary["sm_clock_mhz"] == 1500 and summary["power_w"] == 650
    assert summary["samples"] == 3 and summary["sm_clock_max_mhz"] == 1980
    shares = summary["held_down_share"]
    assert shares == {"power cap": 2 / 3, "hardware slowdown": 0.0, "thermal": 1 / 3}


def test_the_gpu_is_sampled_over_the_timed_steps_only_and_the_line_says_what_held_it(
    monkeypatch,
):
    """Samples start after the warm-up and stop with the last timed step; the printed line gives
    the medians against their limits and the reasons' shares."""
    import time

    from rich.console import Console

    from tuneforge.bench import timing
    from tuneforge.cli import bench as cli_bench
    from tuneforge.hardware.nvml import Sample

    finished = [0]
    seen = []

    class FakeNvml:
        max_sm_clock_mhz, power_limit_w = 1980.0, 700.0

        def read(self):
            seen.append(finished[0])
            return Sample(1500.0, 690.0, 0x4)

    def step():
        time.sleep(0.03)
        finished[0] += 1

    monkeypatch.setattr(timing, "open_nvml", lambda: (FakeNvml(), ""))
    result = timing.time_steps(step, warmup=3, steps=4)
    assert seen and min(seen) >= 3 and max(seen) <= 7
    clocks = result["gpu_clocks"]
    assert clocks["samples"] == len(seen) and clocks["held_down_share"]["power cap"] == 1.0

    console = Console(record=True, width=200)
    monkeypatch.setattr(cli_bench, "console", console)
    line = {"tokens_per_s": 1.0, "ms_per_step": 1.0, "peak_alloc_gib": 1.0, "mfu": 0.1}
    cli_bench._print_line(line | {"peak_reserved_gib": 1.0} | result)
    text = console.export_text()
    assert "SM clock 1,500 of 1,980 MHz, 690 of 700 W" in text
    assert "held down by the power cap in 100% of samples" in text


def test_a_sampler_whose_reading_fails_keeps_what_it_read_and_says_why():
    import threading

    from tuneforge.bench.gpu_clocks import GpuSampler
    from tuneforge.hardware.nvml import Sample

    readings = iter([Sample(1500.0, 690.0, 0), Sample(1400.0, 695.0, 0x4)])
    done = threading.Event()

    def read():
        try:
            return next(readings)
        except StopIteration:
            done.set()
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST") from None

    with GpuSampler(read, interval_s=0.001) as sampler:
        done.wait(5)
    summary = sampler.summary(1980.0, 700.0)
    assert summary["samples"] == 2 and summary["sm_clock_mhz"] == 1450.0
    assert summary["stopped_by"] == "NVML_ERROR_GPU_IS_LOST"


def test_the_summary_table_gives_each_runs_clock_and_marks_the_power_cap():
    from rich.console import Console

    from tuneforge.cli.bench import summary_table

    run = {"workload": "w", "variant": "", "tokens_per_s": 1000.0, "ms_per_step": 1.0}
    run |= {"peak_alloc_gib": 1.0, "mfu": 0.5}
    capped = {"sm_clock_mhz": 1545.0, "held_down_share": {"power cap": 1.0}}
    free = {"sm_clock_mhz": 1935.0, "held_down_share": {"power cap": 0.2}}
    results = [
        run | {"system": "tuneforge", "gpu_clocks": capped},
        run | {"system": "hf+peft", "gpu_clocks": free},
        run | {"system": "unsloth", "gpu_clocks": {"unavailable": "no CUDA device"}},
    ]
    console = Console(record=True, width=200)
    console.print(summary_table(results))
    text = console.export_text()
    rows = text.splitlines()
    assert "1,545*" in next(r for r in rows if "tuneforge" in r)
    hf = next(r for r in rows if "hf+peft" in r)
    assert "1,935" in hf and "1,935*" not in hf
    assert "held by the power cap" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case without a GPU")
def test_without_a_gpu_nothing_is_sampled_and_the_result_says_why():
    from tuneforge.bench import timing

    result = timing.time_steps(lambda: None, warmup=1, steps=2)
    assert result["gpu_clocks"] == {"unavailable": "no CUDA device"}


def test_an_enforced_cap_holds_the_allocator_to_it(monkeypatch):
    """With `--enforce-cap` a capped workload's run may reserve no more than the cap, on any GPU
    size: the allocator's fraction of the device is the cap over the device's memory."""
    import types

    import torch

    from tuneforge.bench import child
    from tuneforge.bench.runner import Run

    fractions = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: types.SimpleNamespace(total_memory=150 * 2**30),
    )
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fractions.append)
    child.enforce_memory_cap(16.7)
    assert fractions == [pytest.approx(16.7 / 150)]
    spec = Run("llama3-8b-lora-capped", "unsloth", checkpointing=True).spec(1, 1, False, 16.7)
    assert spec["memory_cap_gib"] == 16.7


def test_the_cap_a_run_is_held_to(monkeypatch):
    """`--enforce-cap` holds capped workloads to their own cap and leaves the others; `--cap-gib`
    holds every run to its value; the result line says so."""
    from rich.console import Console

    from tuneforge.bench.runner import held_cap
    from tuneforge.bench.workloads import WORKLOADS
    from tuneforge.cli import bench as cli_bench

    capped, free = WORKLOADS["llama3-8b-lora-capped"], WORKLOADS["llama3-8b-lora"]
    assert held_cap(capped, False, None) is None
    assert held_cap(capped, True, None) == capped.memory_cap_gib == 16.7
    assert held_cap(free, True, None) is None
    assert held_cap(capped, True, 16.5) == held_cap(free, False, 16.5) == 16.5

    console = Console(record=True, width=160)
    monkeypatch.setattr(cli_bench, "console", console)
    line = {"tokens_per_s": 1.0, "ms_per_step": 1.0, "peak_alloc_gib": 1.0, "mfu": 0.1}
    cli_bench._print_line(line | {"peak_reserved_gib": 1.0, "memory_cap_gib": 16.5})
    assert "allocator held to 16.5 GiB" in console.export_text()


def test_the_timeline_separates_hidden_and_exposed_collectives_and_idle_time():
    """Spans in microseconds: compute 0-10 and 12-20 (overlapping kernels 5-8), a collective
    8-14 (hidden by compute but for 10-12) and one 25-30 (exposed), idle 20-25."""
    from tuneforge.bench.profile import timeline

    spans = [
        (0, 10_000, False),
        (5_000, 8_000, False),
        (12_000, 20_000, False),
        (8_000, 14_000, True),
        (25_000, 30_000, True),
    ]
    got = timeline(spans)
    assert got == {"compute": 18.0, "collectives": 11.0, "exposed_collectives": 7.0, "idle": 5.0}
    assert timeline([])["idle"] == 0.0


def test_idle_gaps_are_binned_by_length_with_the_kernels_around_the_longest():
    """Over two steps: a 5 µs gap, a 50 µs one (after an overlapping pair, so measured from the
    later end) and a 300 µs one."""
    from tuneforge.bench.profile import idle_gaps

    kernels = [
        (0, 100, "a"),
        (105, 200, "b"),
        (150, 400, "c"),
        (180, 300, "d"),
        (450, 500, "e"),
        (800, 900, "f"),
    ]
    got = idle_gaps(kernels, steps=2)
    assert got["ms_per_step"] == pytest.approx(
        {"under_10us": 0.0025, "10_to_100us": 0.025, "over_100us": 0.15}
    )
    assert got["count_per_step"] == 1.5
    assert got["longest"][0] == {"ms": 0.3, "after": "e", "before": "f"}
    assert got["longest"][1] == {"ms": 0.05, "after": "c", "before": "e"}


def test_kernels_are_traced_to_the_operators_that_launched_them():
    """Profiler events as torch gives them: a kernel hangs on the runtime call that launched it,
    whose parents are the operators; the runtime's own name is left out of the chain."""
    from types import SimpleNamespace as Event

    from tuneforge.bench.profile import launchers

    def op(name, parent=None, kernels=()):
        return Event(name=name, cpu_parent=parent, kernels=[Event(name=k) for k in kernels])

    to = op("aten::to")
    copy = op("aten::copy_", op("aten::_to_copy", to))
    contiguous = op("aten::copy_", op("aten::clone", op("aten::contiguous")))
    events = [
        to,
        op("cudaMemcpyAsync", copy, ["Memcpy DtoD"]),
        op("cudaMemcpyAsync", copy, ["Memcpy DtoD"]),
        op("cudaMemcpyAsync", contiguous, ["Memcpy DtoD"]),
        op("cuLaunchKernel", op("aten::mm"), ["gemm"]),
    ]
    got = launchers(events, {"Memcpy DtoD"})
    assert got == {
        "Memcpy DtoD": [
            {"ops": "aten::copy_ < aten::_to_copy < aten::to", "launches": 2},
            {"ops": "aten::copy_ < aten::clone < aten::contiguous", "launches": 1},
        ]
    }


def test_nccl_channels_are_set_before_the_process_group_starts(monkeypatch):
    import os

    from tuneforge.parallel.distributed import init_distributed

    monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    init_distributed()
    assert "NCCL_MAX_NCHANNELS" not in os.environ
    init_distributed(nccl_max_channels=8)
    assert os.environ["NCCL_MAX_NCHANNELS"] == "8"


def test_the_allocator_cache_is_split_by_stream_and_waiting_frees_are_counted():
    """A synthetic allocator snapshot: two segments on the compute stream, one on a copy
    stream; two frees that waited for another stream overlap (3 MiB at once), one that
    completed before them is not among them."""
    from tuneforge.bench.profile import cache_breakdown

    mib = 2**20
    snapshot = {
        "segments": [
            {"stream": 0, "total_size": 8 * mib, "allocated_size": 6 * mib},
            {"stream": 0, "total_size": 4 * mib, "allocated_size": 0},
            {"stream": 0x55, "total_size": 2 * mib, "allocated_size": 1 * mib},
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": 1, "size": mib},
                {"action": "free_requested", "addr": 1, "size": mib},
                {"action": "free_completed", "addr": 1, "size": mib},
                {"action": "free_requested", "addr": 2, "size": 2 * mib},
                {"action": "free_requested", "addr": 3, "size": 1 * mib},
                {"action": "free_completed", "addr": 2, "size": 2 * mib},
                {"action": "free_completed", "addr": 3, "size": 1 * mib},
            ]
        ],
    }
    cache = cache_breakdown(snapshot, {0x55: "copies to_device"})
    gib = 2**30
    assert cache["by_stream"]["compute"] == {
        "reserved_gib": round(12 * mib / gib, 3),
        "allocated_gib": round(6 * mib / gib, 3),
        "cached_free_gib": round(6 * mib / gib, 3),
    }
    assert cache["by_stream"]["copies to_device"]["cached_free_gib"] == round(mib / gib, 3)
    assert cache["awaiting_free_peak_gib"] == round(3 * mib / gib, 3)


def test_fp8_variants_are_known_so_a_gpu_without_fp8_leaves_them_out():
    runs = plan_runs([WORKLOADS["llama3-8b-lora"]], ["unsloth"])
    fp8 = [run.variant for run in runs if needs_fp8(run)]
    assert fp8 == ["compiled+budget0.8+chunk2048+onedoc+fp8+fp8base"]
    assert needs_fp8(Run("llama3.2-1b-full-fsdp2-2gpu", "tuneforge", "compiled+fp8hybrid+1gpu"))
    assert not needs_fp8(Run("llama3-8b-lora", "unsloth", "", False))


@pytest.mark.parametrize("adapter", ["qlora", "dora"])
def test_qlora_and_dora_workloads_run_for_tuneforge_and_hf_peft_on_a_cpu(adapter):
    """Both systems train the same adapters: QLoRA's 4-bit base (ours: its products, `precision`
    says so; PEFT's: bitsandbytes' Linear4bit), or DoRA; Unsloth is left out of DoRA."""
    from tuneforge.bench.ours import run_ours
    from tuneforge.bench.peers import run_hf
    from tuneforge.bench.workloads import ALL_LINEAR, Workload

    if adapter == "qlora":
        pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")
    settings = {"quantize": "nf4"} if adapter == "qlora" else {"dora": True}
    workload = Workload("tiny", "demo-tiny", ALL_LINEAR, tokens=256, **settings)
    ours = run_ours(workload, "eager+full+onedoc", warmup=1, steps=1)
    peer = run_hf(workload, liger=False, checkpointing=True, warmup=1, steps=1)
    assert ours["ms_per_step"] > 0 and peer["ms_per_step"] > 0
    if adapter == "qlora":
        assert any("4-bit NF4" in line for line in ours["precision"])
    real = WORKLOADS[f"llama3-8b-{adapter}"]
    with_unsloth = "unsloth" in {run.system for run in plan_runs([real], ["unsloth"])}
    assert with_unsloth == (adapter == "qlora")
