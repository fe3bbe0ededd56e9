"""The planned run's memory with one setting changed: what the planner's advice weighs
(checkpointing, host memory, the compiled blocks' budget, kept blocks, the whole model on every
GPU)."""

from dataclasses import dataclass, replace

from tuneforge.hardware.gpus import GIB
from tuneforge.plan.memory import Setup, predict_memory
from tuneforge.plan.policies import recomputed_blocks
from tuneforge.plan.traffic import step_traffic_bytes

COMPILE_BUDGET = 0.8
"""The compiled blocks' memory budget the planner proposes before checkpointing: the blocks then
make their cheapest activations again in backward, for little speed (bench/RESULTS.md)."""

KEPT_BLOCKS_SHARE = 0.9
"""Blocks that keep their activations are proposed up to this share of the GPU: near its limit
the allocator's retries cost more than the recomputation saves (bench/RESULTS.md)."""


@dataclass(frozen=True)
class MemoryOptions:
    """Total GiB per GPU of the planned run with one memory setting changed."""

    without_checkpointing: float
    full_checkpointing: float
    offloaded_checkpoints: float
    """Full checkpointing with the blocks' inputs in host memory."""
    embedding_on_host: float
    """The frozen, untied input embedding in host memory (equal to the plan where it cannot be)."""
    kept_blocks: tuple[int, float]
    """The most checkpointed blocks that could keep their activations within
    `KEPT_BLOCKS_SHARE` of the GPU (`train.keep_activations`), and the total then."""
    compile_budget: float
    """`train.compile_memory_budget` at `COMPILE_BUDGET` (equal to the plan where the blocks are
    not compiled, are checkpointed, or keep less already)."""
    replicated: float
    """The whole model on every GPU (DDP, ZeRO stage 0)."""
    replicated_traffic_gb: float
    """What DDP's all-reduce sends per GPU and optimizer step (GB)."""


def memory_options(setup: Setup, capacity: float, replicated: float) -> MemoryOptions:
    """`replicated`: the run's GiB with the whole model on every GPU (computed by the caller,
    which decides the strategy with it)."""
    return MemoryOptions(
        without_checkpointing=predict_memory(replace(setup, checkpointing="none")).total / GIB,
        full_checkpointing=predict_memory(replace(setup, checkpointing="full")).total / GIB,
        offloaded_checkpoints=predict_memory(
            replace(setup, checkpointing="full", offload_checkpoints=True)
        ).total
        / GIB,
        embedding_on_host=predict_memory(replace(setup, offload_embedding=True)).total / GIB,
        compile_budget=predict_memory(
            replace(setup, compile_memory_budget=min(setup.compile_memory_budget, COMPILE_BUDGET))
        ).total
        / GIB,
        kept_blocks=_most_kept_blocks(setup, capacity * KEPT_BLOCKS_SHARE),
        replicated=replicated,
        replicated_traffic_gb=step_traffic_bytes(replace(setup, zero_stage=0), 0) / 1e9,
    )


def _most_kept_blocks(setup: Setup, within_gib: float) -> tuple[int, float]:
    """The most recomputed blocks that could keep their activations with the total within
    `within_gib`, and that total; (the configured count, its total) where none more can."""
    kept = setup.keep_activations
    total = predict_memory(setup).total / GIB
    while recomputed(replace(setup, keep_activations=kept)):
        more = predict_memory(replace(setup, keep_activations=kept + 1)).total / GIB
        if more > within_gib:
            break
        kept, total = kept + 1, more
    return kept, total


def recomputed(setup: Setup) -> set[int]:
    """The recomputed blocks: those with offloaded or kept activations run once."""
    return recomputed_blocks(
        setup.args.num_layers,
        setup.checkpointing,
        setup.checkpoint_every,
        setup.offload_activations,
        setup.keep_activations,
    )
