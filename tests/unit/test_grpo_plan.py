"""The planner on a GRPO run: the step trains on each read record once per sample of its group,
and the key/value cache of the sampling is counted as the generator holds it."""

from dataclasses import replace

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
