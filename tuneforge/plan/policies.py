"""Which blocks a run recomputes, keeps or offloads, and whether FSDP2 reshards after forward:
decided from the configuration alone, so that the planner predicts with the very rules the
wrappers in `parallel/` apply."""

from tuneforge.config.sections.parallel import ParallelSection


def checkpointed_blocks(num_layers: int, mode: str, every: int = 2) -> list[int]:
    """Indexes of the blocks whose activations are recomputed: all (`full`), blocks k, 2k, ...
    counted from 1 (`selective`), or none."""
    if mode == "full":
        return list(range(num_layers))
    if mode == "selective":
        return [index for index in range(num_layers) if (index + 1) % every == 0]
    return []


def offloaded_blocks(num_layers: int, count: int) -> list[int]:
    """Indexes of `count` blocks spread evenly over the model, whose activations wait in host
    memory (each in the middle of its share of the blocks)."""
    count = min(count, num_layers)
    return sorted({int((k + 0.5) * num_layers / count) for k in range(count)})


def recomputed_blocks(
    num_layers: int,
    mode: str,
    every: int = 2,
    offload_activations: int = 0,
    keep_activations: int = 0,
) -> set[int]:
    """The blocks run again in backward: those checkpointing picks, less the
    `offload_activations` blocks whose activations wait in host memory and the last
    `keep_activations` of the rest, which keep theirs on the GPU (the last ones: backward frees
    them first)."""
    on_host = set(offloaded_blocks(num_layers, offload_activations))
    chosen = [
        index for index in checkpointed_blocks(num_layers, mode, every) if index not in on_host
    ]
    return set(chosen[: max(0, len(chosen) - keep_activations)])


def reshard_after_forward(parallel: ParallelSection) -> bool:
    """ZeRO-3 (True) unless zero_stage 2 or reshard_after_forward False asks for ZeRO-2."""
    if parallel.reshard_after_forward is not None:
        return parallel.reshard_after_forward
    return parallel.zero_stage != 2
