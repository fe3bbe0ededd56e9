"""tuneforge's side of the benchmark: the trainer's own step (`train.step.optimizer_step`) on a
catalog shape with random weights, through the same model, LoRA, checkpointing, compile and
parallel wrappers as `tuneforge train`."""

import math
import random
from dataclasses import replace

import torch

from tuneforge.bench.batches import synthetic_batch, synthetic_pair
from tuneforge.bench.timing import time_steps
from tuneforge.bench.workloads import Variant, Workload
from tuneforge.config.schema import ModelSection, ParallelSection, TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.data.rank_balance import attention_cost, balanced_deal
from tuneforge.hardware.gpus import GIB, release_cached_memory
from tuneforge.models.api import load_model
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    LoraShape,
    forward_flops_per_token,
    training_flops_per_token,
)
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.parallel.distributed import Dist, init_distributed, parallelize, strategy_of
from tuneforge.parallel.host_embedding import embedding_to_host
from tuneforge.peft.apply import apply_lora
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.trained_weights import TrainedWeights
from tuneforge.train.objective import Objective
from tuneforge.train.objectives import build_objective
from tuneforge.train.optim import build_optimizer
from tuneforge.train.preference import AdaptersOffReference, PreferenceObjective
from tuneforge.train.preference_loss import PreferenceLoss
from tuneforge.train.step import StepResult, StepRunner

DISTINCT_BATCHES = 4
"""Packed batches each rank cycles through; their costs differ (attention grows with each
document's length), so the timed steps are whole cycles of them."""


def batch_seeds(rank: int, world_size: int, workload_gpus: int, same_data: bool) -> list[int]:
    """Seeds of the packed batches a process cycles through: its rank's own; on one GPU standing
    in for a multi-GPU workload, every rank's (the work those ranks share between them); with
    `same_data`, rank 0's on every rank."""
    if same_data:
        ranks = [0]
    elif world_size == 1:
        ranks = list(range(workload_gpus))
    else:
        ranks = [rank]
    return [r * 100 + index for index in range(DISTINCT_BATCHES) for r in ranks]


def rank_batches(
    vocab_size: int, tokens: int, settings: Variant, world: Dist, workload_gpus: int
) -> list[PackedBatch]:
    """This process's batches (`batch_seeds`); with `balanced` on several GPUs, every rank's
    batches dealt again as the trainer's `data.balance_ranks` deals them."""

    def batches(seeds: list[int]) -> list[PackedBatch]:
        return [synthetic_batch(vocab_size, tokens, settings.one_document, s) for s in seeds]

    if not (settings.balanced and world.world_size > 1):
        return batches(batch_seeds(world.rank, world.world_size, workload_gpus, settings.same_data))
    pool = batches(batch_seeds(0, 1, world.world_size, same_data=False))
    costs = [attention_cost(batch.packed.lengths()) for batch in pool]
    dealt = balanced_deal(range(len(pool)), costs, world.world_size, random.Random(0))
    return [pool[index] for index in dealt[world.rank :: world.world_size]]


def whole_cycles(steps: int, batches: int = DISTINCT_BATCHES, micro_batches: int = 1) -> int:
    """`steps` rounded up to whole cycles through `batches`, `micro_batches` of them a step."""
    cycle = batches // math.gcd(batches, micro_batches)
    return -(-steps // cycle) * cycle


def strategy_for(settings: Variant, world: Dist) -> str:
    """DDP or FSDP2 on several GPUs; DDP on one too where a process group exists
    (`bench/ddp_probe.py`: DDP's own cost without a second GPU)."""
    if settings.ddp and torch.distributed.is_initialized():
        return "ddp"
    if world.world_size == 1:
        return "single"
    return "ddp" if settings.ddp else "fsdp"


def workload_objective(workload: Workload, train: TrainSection, model: Decoder) -> Objective:
    """SFT as the trainer builds it, or DPO (sigmoid, β 0.1) against the base with the adapters
    off, as `dpo.reference: auto` picks for a fresh adapter."""
    if workload.objective == "dpo":
        reference = AdaptersOffReference(model)
        return PreferenceObjective(model, PreferenceLoss(), reference, train.loss_chunk_tokens)
    return build_objective(train, model)


def step_flops(workload: Workload, args: ModelArgs, batch: PackedBatch) -> float:
    """A micro-batch's FLOPs: training each document, plus a preference run's reference forward."""
    lora = lora_shape(workload)
    total = 0.0
    for length in batch.packed.lengths():
        total += length * training_flops_per_token(args, length, lora)
        if workload.objective == "dpo":
            total += length * forward_flops_per_token(args, length)
    return total


def lora_shape(workload: Workload) -> LoraShape | None:
    if workload.targets is None:
        return None
    banks = tuple(t.split(".")[-1] for t in workload.targets if t.startswith("experts."))
    dense = tuple(t for t in workload.targets if not t.startswith("experts."))
    return LoraShape(16, dense, banks)


def run_ours(
    workload: Workload,
    variant: str,
    warmup: int,
    steps: int,
    profile: bool = False,
    host_profiler=None,
) -> dict:
    """`host_profiler` (a `cProfile.Profile`) runs over the timed steps only; `steps` is rounded
    up to whole cycles of the distinct batches."""
    settings = Variant.parse(variant)
    world = init_distributed(settings.nccl_max_channels)
    accum = settings.grad_accum_steps
    tokens = settings.tokens or workload.tokens
    torch.manual_seed(0)
    model = load_model(
        workload.shape,
        num_layers=workload.layers,
        dtype="bfloat16",
        device=world.device,
        attention=settings.attention,
        seed=0,
    )
    if workload.targets is not None:
        lora = {
            "target_modules": list(workload.targets),
            "rank": 16,
            "alpha": 32,
            "compute_dtype": "float32" if settings.fp32_lora else "model",
            "use_dora": workload.dora,
        }
        apply_lora(model, lora, torch.Generator(world.device).manual_seed(1), torch.float32)
    base = ModelSection(name=workload.shape, quantize=workload.quantize)
    # in the results: what ran in low precision, no silent bf16
    precision = settings.precision()
    engaged = apply_precision(model, precision, base=base).lines
    if settings.offload_embedding:
        embedding_to_host(model, world.world_size)
    train = TrainSection(  # the trainer's own settings for this variant
        max_steps=warmup + steps,
        tokens_per_micro_batch=tokens,
        grad_accum_steps=accum,
        cuda_graph=settings.cuda_graph,
        activation_checkpointing=settings.checkpointing,
        compile=settings.compiled,
        offload_checkpoints=settings.offload,
        compile_memory_budget=settings.memory_budget,
        offload_activations=settings.offload_activations,
        keep_activations=settings.keep_activations,
        loss_chunk_tokens=settings.loss_chunk_tokens,
    )
    wrap_blocks(model, replace(BlockWrapping.of(train), autotune=settings.autotune))
    parallel = ParallelSection(
        strategy=strategy_for(settings, world),
        zero_stage=2 if settings.zero2 else None,
        reduce_dtype="model" if settings.bf16_reduce else "float32",
    )
    strategy = strategy_of(parallel, world)
    weights = TrainedWeights.of(precision.master_weights, "bfloat16")  # the trainer's default
    objective = parallelize(
        workload_objective(workload, train, model),
        model.layers,
        strategy,
        parallel,
        world,
        weights.fp32_shards(strategy == "fsdp"),
    )
    stack_frozen_weights(model)
    release_cached_memory(world.device)
    optimizer = build_optimizer(model, train, world.device, weights)
    if workload.objective == "dpo":
        vocab = model.args.vocab_size
        batches = [synthetic_pair(vocab, tokens, index) for index in range(DISTINCT_BATCHES)]
    else:
        batches = rank_batches(model.args.vocab_size, tokens, settings, world, workload.gpus)
    steps = whole_cycles(steps, len(batches), accum)
    counter = iter(range(10**9))
    queued: list[StepResult] = []
    queue_step = StepRunner(objective, model, optimizer, train, world.device)

    def step() -> None:
        """As the trainer's loop: a step's numbers are read once the next step is queued."""
        step_batches = [batches[next(counter) % len(batches)] for _ in range(accum)]
        result = queue_step(iter(step_batches), 1e-4)
        if queued:
            queued.pop().get()
        queued.append(result)

    result = time_steps(step, warmup, steps, host_profiler) | {"steps": steps}
    if queue_step.captured is not None:  # replays allocate nothing: the captured step's peak
        peak = queue_step.captured.peak_allocated / GIB
        result["peak_alloc_gib"] = max(result["peak_alloc_gib"], peak)
    if profile:
        from tuneforge.bench.profile import peak_breakdown, profile_steps

        result["profile"] = profile_steps(step) | {"memory": peak_breakdown(step)}
        if world.world_size > 1:  # a rank that waits for the others shows it in its timeline
            timelines: list = [None] * world.world_size
            torch.distributed.all_gather_object(timelines, result["profile"]["timeline"])
            result["profile"]["timeline_by_rank"] = timelines
    flops = sum(step_flops(workload, model.args, batch) for batch in batches) / len(batches)
    documents = sum(b.packed.cu_seqlens.numel() - 1 for b in batches) / len(batches)
    return result | {
        "system": "tuneforge",
        "variant": variant,
        "tokens_per_step": tokens * accum * world.world_size,
        "flops_per_step": flops * accum * world.world_size,
        "gpus": world.world_size,
        "documents_per_step": documents * accum,
        "padding_share": 0.0,
        "attention": model.attention_backend,
        "precision": engaged,
        "is_main": world.is_main,
    }
