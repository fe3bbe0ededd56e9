"""The planner on a GRPO run: the step trains on each read record once per sample of its group,
and the key/value cache of the sampling is counted as the generator holds it."""

from dataclasses import replace

import pytest

from tuneforge.config import load_config
from tuneforge.models.api import load_model
from tuneforge.plan.memory import generation_cache_bytes, predict_memory
from tuneforge.plan.planner import run_model_args, setup_of
from tuneforge.plan.prediction import Hardware

DEMO = "examples/demo.yaml"


def test_the_cache_is_counted_as_the_generator_allocates_it():
    model = load_model("demo-tiny", dtype="float32", device="cpu", seed=0)
    cache = model.new_cache(12, 40)
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert generation_cache_bytes(model.args, 12, 40, 4) == held


def test_a_grpo_step_trains_on_its_groups_and_peaks_at_the_larger_of_cache_and_step():
    sft = load_config(DEMO, [])
    grpo = load_config(DEMO, ["train.objective=grpo", "grpo.num_generations=6"])
    args = run_model_args(sft)
    plain = setup_of(sft, args, Hardware(gpu="H100"), 16.0)
    sampled = setup_of(grpo, args, Hardware(gpu="H100"), 16.0)
    assert sampled.tokens_per_micro_batch == 6 * plain.tokens_per_micro_batch
    sequences = 6 * sft.train.tokens_per_micro_batch / 16.0
    expected = generation_cache_bytes(args, sequences, 16.0 + grpo.grpo.max_new_tokens, 4)
    assert sampled.generation_cache_bytes == expected > 0
    step_only = predict_memory(replace(sampled, generation_cache_bytes=0.0))
    huge = replace(sampled, generation_cache_bytes=step_only.allocated * 10)
    assert predict_memory(sampled).allocated == step_only.allocated  # the cache is smaller here
    assert predict_memory(huge).allocated > step_only.allocated * 9
    shown = predict_memory(sampled).gib()
    assert shown["generation_cache"] * (1 << 30) == expected
    assert "generation_cache" not in predict_memory(plain).gib()


def test_sampling_time_is_the_prefill_then_one_decode_step_per_new_token():
    from tuneforge.hardware.step_rates import H200
    from tuneforge.models.cost import forward_flops_per_token, forward_matmul_flops_per_token
    from tuneforge.plan.sampling_time import (
        FORWARD_LAUNCHES,
        sampling_bound_seconds,
        sampling_seconds,
    )

    args = run_model_args(load_config(DEMO, ["model.name=llama-3-8b"]))
    prompts, samples, new = [300, 500], 8, 128
    prefill = 300 * forward_flops_per_token(args, 300) + 500 * forward_flops_per_token(args, 500)
    cache = generation_cache_bytes(args, 16, 400 + 64, 2)
    memory = (args.num_params() * 2 + cache) / (H200.memory_gbps * 1e9)
    compute = 16 * forward_matmul_flops_per_token(args) / (H200.bf16_tflops * 1e12)
    host = 32 * H200.host_s_per_block * H200.eager_launch * FORWARD_LAUNCHES
    expected = prefill / (H200.bf16_tflops * 1e12) + new * max(memory + compute, host)
    assert sampling_seconds(args, prompts, samples, new, 2, H200) == expected
    assert sampling_seconds(args, prompts, samples, 0, 2, H200) == 0.0
    # a decode step replayed from a CUDA graph waits for no host: its memory and compute alone
    replayed = prefill / (H200.bf16_tflops * 1e12) + new * (memory + compute)
    assert sampling_seconds(args, prompts, samples, new, 2, H200, captured=True) == replayed
    # the bound: the weights and the cache read once a decode step at the spec's bandwidth
    bound = new * (args.num_params() * 2 + cache) / 4.8e12
    assert sampling_bound_seconds(args, prompts, samples, new, 2, 4800.0) == pytest.approx(bound)
    assert 2.9e-3 < bound / new < 4.0e-3  # an 8B model in bf16 at 4.8 TB/s: 3.3 ms and the cache


def test_a_grpo_step_trains_on_every_sample_after_sampling_them():
    from tuneforge.hardware.step_rates import H200
    from tuneforge.plan.step_estimate import estimate_step

    sft = load_config(DEMO, ["model.name=llama-3-8b", "lora.enabled=true"])
    grpo = load_config(
        DEMO, ["model.name=llama-3-8b", "lora.enabled=true", "train.objective=grpo",
               "grpo.num_generations=4", "grpo.max_new_tokens=64"],
    )  # fmt: skip
    args = run_model_args(sft)
    read = [[40, 60, 50]]
    plain = estimate_step(sft, setup_of(sft, args, Hardware(gpu="H200"), 50.0), read * 1, H200)
    four = estimate_step(sft, setup_of(sft, args, Hardware(gpu="H200"), 50.0), [read[0] * 4], H200)
    sampled = estimate_step(grpo, setup_of(grpo, args, Hardware(gpu="H200"), 50.0), read, H200)
    assert "sampling" not in plain.parts and sampled.parts["sampling"] > 0
    for part, seconds in four.parts.items():  # the training: each document four times
        assert sampled.parts[part] == seconds
