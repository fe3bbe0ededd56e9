"""What `parallel.strategy: auto` runs on several processes: DDP where every GPU can hold the
whole model with room to spare, FSDP2 otherwise. DDP sends only the trainable gradients each
step (LoRA's adapters: a few MB), where FSDP2 also gathers every weight, frozen ones included
(bench/RESULTS.md compares their scaling)."""

from tuneforge.config.sections.parallel import ParallelSection
from tuneforge.parallel_dims import ParallelDims

REPLICATED_SHARE = 0.85
"""DDP is chosen (or proposed) where the whole model's predicted peak stays within this share of
a GPU: the planner's prediction is within a few % of measured peaks, the rest is margin."""


def resolve_dims(
    parallel: ParallelSection,
    data_parallel: int,
    replicated_gib: float,
    gpu_memory_gib: float | None,
) -> tuple[ParallelDims, str]:
    """(layout, why) for `data_parallel` ranks (all the GPUs: with a tensor dimension, fewer of
    them read different data); `replicated_gib`: the predicted per-GPU peak with the whole model
    on every GPU."""
    mesh = (parallel.tensor_parallel, parallel.expert_parallel, parallel.data_parallel_replicate)
    if max(mesh) > 1 and data_parallel > 1:
        return ParallelDims.of("fsdp", data_parallel, *mesh), "a device mesh, as configured"
    strategy, why = _strategy(parallel, data_parallel, replicated_gib, gpu_memory_gib)
    return ParallelDims.of(strategy, data_parallel), why


def _strategy(
    parallel: ParallelSection,
    data_parallel: int,
    replicated_gib: float,
    gpu_memory_gib: float | None,
) -> tuple[str, str]:
    if parallel.strategy != "auto":
        return parallel.strategy, "as configured"
    if data_parallel == 1:
        return "single", "one process"
    if parallel.zero_stage is not None or parallel.reshard_after_forward is not None:
        return "fsdp", "parallel.zero_stage (or reshard_after_forward) asks for FSDP"
    if gpu_memory_gib is None:
        return "fsdp", "the GPU's memory is unknown here"
    if replicated_gib <= REPLICATED_SHARE * gpu_memory_gib:
        return "ddp", (
            f"every GPU holds the whole model: {replicated_gib:.1f} of {gpu_memory_gib:.0f} GiB "
            "predicted"
        )
    return "fsdp", (
        f"the whole model on every GPU would need {replicated_gib:.1f} GiB, over "
        f"{REPLICATED_SHARE:.0%} of {gpu_memory_gib:.0f}"
    )
