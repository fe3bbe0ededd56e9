"""What the planner tells the user to change: the problems of a plan and the settings that
would make it fit (the compiled blocks' memory budget, checkpointing, host memory, ZeRO stage,
micro-batch, sequence length), and the recomputation memory left over could spare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneforge.plan.memory import GIB
from tuneforge.plan.strategy import REPLICATED_SHARE

COMPILE_BUDGET = 0.8
"""The compiled blocks' memory budget the planner proposes before checkpointing: on Llama-3-8B
LoRA at 4,096 tokens it kept 28.2 instead of 33.7 GiB for ~1% of speed (bench/RESULTS.md)."""

KEPT_BLOCKS_SHARE = 0.9
"""Blocks that keep their activations are proposed up to this share of the GPU: near its limit
the allocator's retries cost more than the recomputation saves (bench/RESULTS.md)."""

if TYPE_CHECKING:
    from tuneforge.config import RunConfig
    from tuneforge.plan.planner import Hardware, Plan


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


def advise(
    plan: Plan, config: RunConfig, hardware: Hardware, stage: int, options: MemoryOptions
) -> None:
    capacity = plan.gpu_memory_gib
    total = plan.memory.total / GIB
    train = config.train
    if not plan.fits:
        plan.problems.append(
            f"predicted {total:.1f} GiB per GPU exceeds the {capacity:.0f} GiB of a {hardware.gpu}"
        )
    budget_fits = not plan.fits and options.compile_budget <= capacity
    if budget_fits and train.compile and train.activation_checkpointing == "none":
        plan.advice.append(
            f"a smaller memory budget for the compiled blocks fits: {options.compile_budget:.1f} "
            f"GiB with train.compile_memory_budget: {COMPILE_BUDGET} (their cheapest activations "
            "made again in backward: about 1% slower, where checkpointing costs a forward pass)"
        )
    if plan.gradient_checkpointing_needed and train.activation_checkpointing == "none":
        plan.advice.append(
            f"activation checkpointing is needed: {options.without_checkpointing:.1f} GiB without "
            f"it, {options.full_checkpointing:.1f} GiB with train.activation_checkpointing: full"
        )
    one_process = hardware.data_parallel == 1
    if (
        not plan.fits
        and one_process
        and not train.offload_checkpoints
        and options.full_checkpointing > capacity >= options.offloaded_checkpoints
    ):
        plan.advice.append(
            "full checkpointing with its inputs in host memory fits: "
            f"{options.offloaded_checkpoints:.1f} GiB with train.activation_checkpointing: full "
            "and train.offload_checkpoints: true"
        )
    if (
        not plan.fits
        and one_process
        and not train.offload_embedding
        and options.embedding_on_host <= capacity
    ):
        plan.advice.append(
            f"the frozen embedding in host memory fits: {options.embedding_on_host:.1f} GiB with "
            "train.offload_embedding: true"
        )
    kept, kept_total = options.kept_blocks
    if plan.fits and kept > train.keep_activations:
        plan.advice.append(
            f"memory is left for {kept} checkpointed blocks to keep their activations: "
            f"{kept_total:.1f} GiB with train.keep_activations: {kept} (each one recomputed "
            "block fewer)"
        )
    if (
        hardware.data_parallel > 1
        and plan.zero_stage >= 2
        and options.replicated <= capacity * REPLICATED_SHARE
    ):
        plan.advice.append(
            f"every GPU can hold the whole model: {options.replicated:.1f} GiB with "
            "parallel.strategy: ddp, which sends "
            f"{options.replicated_traffic_gb:.2f} GB per GPU and step (gradients only) against "
            f"FSDP's {plan.collective_gb_per_step:.2f} GB (weights gathered, gradients reduced); "
            "a 1B full fine-tune on two H200s ran 1.23x faster with DDP (bench/RESULTS.md)"
        )
    elif hardware.data_parallel > 1 and plan.zero_stage not in (0, stage):
        plan.advice.append(f"the report's choice here is {plan.zero_stage_advice}")
    if plan.largest_micro_batch_tokens < train.tokens_per_micro_batch:
        plan.advice.append(
            f"the largest micro-batch that fits is about {plan.largest_micro_batch_tokens} tokens "
            "(train.tokens_per_micro_batch); keep the global batch with grad_accum_steps"
        )
    if (
        plan.suggested_max_seq_len is not None
        and plan.suggested_max_seq_len < config.data.max_seq_len
    ):
        plan.advice.append(
            f"99% of the records fit in {plan.suggested_max_seq_len} tokens: "
            f"data.max_seq_len={plan.suggested_max_seq_len} is enough"
        )
