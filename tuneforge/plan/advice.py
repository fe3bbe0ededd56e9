"""What the planner tells the user to change: the problems of a plan and the settings that
would make it fit (the compiled blocks' memory budget, checkpointing, host memory, ZeRO stage,
micro-batch, sequence length), and the recomputation memory left over could spare."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneforge.hardware.gpus import GIB
from tuneforge.plan.memory_options import COMPILE_BUDGET, MemoryOptions
from tuneforge.plan.strategy import REPLICATED_SHARE

RANK_WAIT_WORTH_BALANCING = 1.02
"""Balancing the ranks' work is proposed where it would shorten the steps by more than this."""

if TYPE_CHECKING:
    from tuneforge.config import RunConfig
    from tuneforge.plan.prediction import Hardware, Plan


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
            f"FSDP's {plan.collective_gb_per_step:.2f} GB (weights gathered, gradients reduced)"
        )
    elif hardware.data_parallel > 1 and plan.zero_stage not in (0, stage):
        plan.advice.append(f"the report's choice here is {plan.zero_stage_advice}")
    if (
        not config.data.balance_ranks
        and plan.slowest_rank_factor > RANK_WAIT_WORTH_BALANCING * plan.balanced_slowest_rank_factor
    ):
        plan.advice.append(
            f"each step waits for its slowest rank: {plan.slowest_rank_factor - 1:.0%} over the "
            "mean rank's work (a long document's attention grows with its length squared); "
            "data.balance_ranks: true deals the ranks similar work: "
            f"{plan.balanced_slowest_rank_factor - 1:.0%}"
        )
    largest = plan.largest_micro_batch_tokens
    if 0 < largest < train.tokens_per_micro_batch:
        plan.advice.append(
            f"the largest micro-batch that fits is about {largest} tokens "
            "(train.tokens_per_micro_batch); keep the global batch with grad_accum_steps"
        )
    elif largest == 0 and not plan.fits:
        plan.advice.append(
            "no micro-batch fits, not even the smallest: the weights, gradients and optimizer "
            "states alone leave no room; shard them (more GPUs, ZeRO-3), or train adapters "
            "(LoRA) instead of every weight"
        )
    if (
        plan.suggested_max_seq_len is not None
        and plan.suggested_max_seq_len < config.data.max_seq_len
    ):
        plan.advice.append(
            f"99% of the records fit in {plan.suggested_max_seq_len} tokens: "
            f"data.max_seq_len={plan.suggested_max_seq_len} is enough"
        )
