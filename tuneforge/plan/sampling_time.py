"""The time an objective that samples before it trains (GRPO) spends sampling, one micro-batch
of prompts at a time: each prompt prefilled once (a forward of its tokens), then one decode step
per new token for every completion of the group. A decode step reads the weights and the
key/value cache at the GPU's memory bandwidth and computes little. Launched eagerly it takes the
longer of that and its host time; replayed as a CUDA graph (`models/captured_decode.py`: a dense
model not sharded by FSDP2, its embedding on the GPU) it has no host time to wait for."""

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
    captured: bool = False,
) -> float:
    """`prompts`: the micro-batch's prompt lengths; `samples` completions of each, of
    `generated` tokens at most (the step waits for the longest); `captured`: the decode step is
    a CUDA graph's replay."""
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
    return seconds + generated * max(memory + compute, 0.0 if captured else host)


def sampling_bound_seconds(
    args: ModelArgs,
    prompts: list[int],
    samples: int,
    generated: int,
    param_bytes: int,
    memory_gbps: float,
) -> float:
    """The decode bound: every decode step reads every weight once and the key/value cache at
    its mean length, at the spec sheet's memory bandwidth `memory_gbps`; nothing else (the
    prefill, a few prompts' forwards, is left out)."""
    if not prompts or not generated:
        return 0.0
    context = sum(prompts) / len(prompts) + generated / 2
    cache = generation_cache_bytes(args, samples * len(prompts), context, param_bytes)
    return generated * (args.num_params() * param_bytes + cache) / (memory_gbps * 1e9)


def decode_captured(args: ModelArgs, sharded: bool, embedding_on_host: bool) -> bool:
    """Whether a run's decode steps replay a CUDA graph (`models/captured_decode.py` decides
    the same way, on the model itself)."""
    return args.moe is None and not sharded and not embedding_on_host
