"""The time an objective that samples before it trains (GRPO) spends sampling, one micro-batch
of prompts at a time: each prompt prefilled once (a forward of its tokens), then one decode step
per new token for every completion of the group. A decode step reads the weights and the
key/value cache at the GPU's memory bandwidth, computes little, and launches every block's
kernels eagerly: it takes the longer of its memory time and its host time."""

from tuneforge.hardware.step_rates import StepRates
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import forward_flops_per_token, forward_matmul_flops_per_token
from tuneforge.plan.memory import generation_cache_bytes

FORWARD_LAUNCHES = 1 / 3
"""A decode step launches each block's forward only: about a third of the kernels of a training
pass (forward, input and weight gradients) that `host_s_per_block` was fitted on."""


def sampling_seconds(
    args: ModelArgs,
    prompts: list[int],
    samples: int,
    generated: int,
    param_bytes: int,
    rates: StepRates,
) -> float:
    """`prompts`: the micro-batch's prompt lengths; `samples` completions of each, of
    `generated` tokens at most (the step waits for the longest)."""
    if not prompts or not generated:
        return 0.0
    prefill = sum(n * forward_flops_per_token(args, n) for n in prompts)
    seconds = prefill / (rates.bf16_tflops * 1e12)
    rows = samples * len(prompts)
    context = sum(prompts) / len(prompts) + generated / 2  # the cache's mean length
    weights = args.num_params() * param_bytes
    cache = generation_cache_bytes(args, rows, context, param_bytes)
    memory = (weights + cache) / (rates.memory_gbps * 1e9)
    compute = rows * forward_matmul_flops_per_token(args) / (rates.bf16_tflops * 1e12)
    host = args.num_layers * rates.host_s_per_block * rates.eager_launch * FORWARD_LAUNCHES
    return seconds + generated * max(memory + compute, host)
