"""tuneforge's side of the benchmark: the trainer's own step (`train.step.optimizer_step`) on a
catalog shape with random weights, the model prepared by the trainer's own pipeline
(`train.prepare.prepare_model`) from the run configuration of the workload's variant."""

import math
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from tuneforge.bench.batches import synthetic_batch, synthetic_pair, synthetic_prompts
from tuneforge.bench.timing import time_steps
from tuneforge.bench.word_tokenizer import word_tokenizer
from tuneforge.bench.workloads import Variant, Workload
from tuneforge.config.objectives.grpo import GrpoSection, RewardSpec
from tuneforge.config.objectives.registry import declaration_of
from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.config.sections.lora import LoraSection
from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.parallel import ParallelSection
from tuneforge.config.sections.train import TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.data.rank_balance import attention_cost, balanced_deal
from tuneforge.execution.block_wrappers import BlockWrapping
from tuneforge.hardware.gpus import GIB
from tuneforge.hardware.step_rates import MEMORY_GBPS
from tuneforge.models.args import ModelArgs
from tuneforge.models.captured_decode import why_not_captured
from tuneforge.models.cost import training_flops_per_token
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import Dist, configured_dims, init_distributed
from tuneforge.peft.selection import lora_shape
from tuneforge.plan.frozen_models import frozen_forward_flops_per_token
from tuneforge.plan.prediction import CPU, Hardware
from tuneforge.plan.sampling_time import sampling_bound_seconds, sampling_seconds
from tuneforge.train.build import build_model
from tuneforge.train.objectives.component import ObjectiveSetup
from tuneforge.train.objectives.grpo import GrpoObjective
from tuneforge.train.objectives.seam import objective_of
from tuneforge.train.prepare import prepare_model
from tuneforge.train.step import StepResult, StepRunner

GRPO_REWARD = "tuneforge.bench.grpo_reward:even_share"

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
    return "ddp" if settings.ddp else "fsdp"  # and any tensor or expert dimension


def workload_lora(workload: Workload, fp32: bool = False) -> LoraSection:
    """Rank-16 adapters on the workload's targets (the peers' too), or full fine-tuning."""
    if workload.targets is None:
        return LoraSection(enabled=False)
    return LoraSection(
        target_modules=list(workload.targets),
        rank=16,
        alpha=32,
        compute_dtype="float32" if fp32 else "model",
        use_dora=workload.dora,
    )


def workload_config(workload: Workload, settings: Variant, world: Dist) -> RunConfig:
    """The run configuration of a workload's variant: what `tuneforge train` would be given for
    the same work. Its batches are synthetic (`bench/batches.py`): the data section is not read."""
    tokens = settings.tokens or workload.tokens
    if workload.objective == "grpo":  # the read micro-batch: its prompts, an answer token each
        tokens = workload.prompts * (workload.tokens + 1)
    return RunConfig(
        model=ModelSection(
            name=workload.shape,
            num_layers=workload.layers,
            attention=settings.attention,
            quantize=workload.quantize,
        ),
        data=DataSection(train=[DataSource(path=Path("synthetic"))], max_seq_len=tokens),
        lora=workload_lora(workload, settings.fp32_lora),
        train=TrainSection(
            objective=workload.objective,
            tokens_per_micro_batch=tokens,
            grad_accum_steps=settings.grad_accum_steps,
            cuda_graph=settings.cuda_graph,
            activation_checkpointing=settings.checkpointing,
            compile=settings.compiled,
            offload_checkpoints=settings.offload,
            compile_memory_budget=settings.memory_budget,
            offload_activations=settings.offload_activations,
            keep_activations=settings.keep_activations,
            offload_embedding=settings.offload_embedding,
            loss_chunk_tokens=settings.loss_chunk_tokens,
        ),
        precision=settings.precision(),
        grpo=GrpoSection(
            num_generations=workload.generations,
            max_new_tokens=workload.completion_tokens,
            rewards=[RewardSpec(function=GRPO_REWARD)],
            log_completions=0,  # the bench writes no run directory
        ),
        parallel=ParallelSection(
            strategy=strategy_for(settings, world),
            zero_stage=2 if settings.zero2 else None,
            reduce_dtype="model" if settings.bf16_reduce else "float32",
            tensor_parallel=settings.tensor_parallel if world.world_size > 1 else 1,
            expert_parallel=settings.expert_parallel if world.world_size > 1 else 1,
        ),
    )


def step_flops(config: RunConfig, args: ModelArgs, batch: PackedBatch) -> float:
    """A micro-batch's FLOPs: training each document, plus the forwards of the objective's
    frozen models (a preference run's reference), as the trainer's MFU counts them."""
    lora = lora_shape(config.lora, args)
    total = 0.0
    for length in batch.packed.lengths():
        total += length * training_flops_per_token(args, length, lora)
        total += length * frozen_forward_flops_per_token(config, args, length)
    return total


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
    config = workload_config(workload, settings, world)
    tokens = config.train.tokens_per_micro_batch
    torch.manual_seed(0)
    model, arrived = build_model(config.model, world.device, config.train.seed)
    wrapping = replace(BlockWrapping.of(config.train), autotune=settings.autotune)
    dims = configured_dims(config.parallel, world)
    sampled = workload.objective == "grpo"
    tokenizer = bench_tokenizer(model.args) if sampled else None
    setup = ObjectiveSetup(config, model, world.device, tokenizer=tokenizer)
    prepared = prepare_model(config, model, world, dims, setup, arrived, wrapping)
    objective, optimizer = prepared.objective, prepared.optimizer
    if sampled:  # every completion runs to its length, as the peer's (identical work)
        inner = objective_of(objective)
        assert isinstance(inner, GrpoObjective)
        inner.stop = set()
        batches = [
            synthetic_prompts(model.args.vocab_size, workload.prompts, workload.tokens, i * 100)
            for i in range(DISTINCT_BATCHES)
        ]
    elif declaration_of(config).data_format == "pairs":
        vocab = model.args.vocab_size
        batches = [synthetic_pair(vocab, tokens, index) for index in range(DISTINCT_BATCHES)]
    else:  # the tensor-parallel ranks of a group read the same data
        data = Dist(dims.data_rank(world.rank), dims.data_parallel_size, world.local_rank)
        batches = rank_batches(model.args.vocab_size, tokens, settings, data, workload.gpus)
    steps = whole_cycles(steps, len(batches), accum)
    counter = iter(range(10**9))
    queued: list[StepResult] = []
    sampling_s: list[float] = []
    queue_step = StepRunner(
        objective, model, optimizer, config.train, world.device, prepared.data_group
    )

    def step() -> None:
        """As the trainer's loop: a step's numbers are read once the next step is queued."""
        step_batches = [batches[next(counter) % len(batches)] for _ in range(accum)]
        result = queue_step(iter(step_batches), 1e-4)
        if queued:
            sampling_s.append(queued.pop().get()["metrics"].get("generation_s") or 0.0)
        queued.append(result)

    result = time_steps(step, warmup, steps, host_profiler) | {"steps": steps}
    if sampled:
        sampling_s.append(queued.pop().get()["metrics"]["generation_s"])
        result |= phases(workload, sampling_s[-steps:], result["ms_per_step"] / 1e3)
        result |= sampling_predictions(workload, model)
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
    if sampled:
        return result | grpo_step_work(workload, model.args) | {
            "system": "tuneforge", "variant": variant, "gpus": world.world_size,
            "padding_share": 0.0, "attention": model.attention_backend, "is_main": world.is_main,
        }  # fmt: skip
    flops = sum(step_flops(config, model.args, batch) for batch in batches) / len(batches)
    documents = sum(b.packed.cu_seqlens.numel() - 1 for b in batches) / len(batches)
    return result | {
        "system": "tuneforge",
        "variant": variant,
        "tokens_per_step": tokens * accum * dims.data_parallel_size,
        "flops_per_step": flops * accum * dims.data_parallel_size,
        "gpus": world.world_size,
        "documents_per_step": documents * accum,
        "padding_share": 0.0,
        "attention": model.attention_backend,
        "precision": prepared.precision.lines,
        "is_main": world.is_main,
    }


def bench_tokenizer(args: ModelArgs):
    """A word tokenizer over the model's vocabulary (`bench/word_tokenizer.py`): what a GRPO
    objective decodes its completions with; the other objectives need none."""
    return word_tokenizer(args.vocab_size, tempfile.mkdtemp())


def trained_tokens(workload: Workload) -> int:
    """A GRPO step's tokens: each prompt with each of its completions."""
    return workload.prompts * workload.generations * (workload.tokens + workload.completion_tokens)


def phases(workload: Workload, sampling_s: list[float], step_s: float) -> dict:
    """A GRPO step's two phases: sampling (its completion tokens a second) and training (the
    rest of the step: the trained tokens a second)."""
    sampling = sum(sampling_s) / max(len(sampling_s), 1)
    completions = workload.prompts * workload.generations * workload.completion_tokens
    training = max(step_s - sampling, 1e-9)
    return {
        "sampling_s": sampling,
        "training_s": training,
        "sampled_tokens_per_s": completions / sampling if sampling else None,
        "trained_tokens_per_s": trained_tokens(workload) / training,
        "steps_per_s": 1.0 / step_s,
    }


def sampling_predictions(workload: Workload, model: Decoder) -> dict[str, float]:
    """Beside the measured `sampling_s`: the planner's sampling part for this step's shape on
    this machine's rates (`plan/sampling_time.py`, its check), and on a GPU the decode bound
    (every weight and the cache read once a decode step at the spec sheet's bandwidth)."""
    device = model.lm_head.weight.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else CPU
    prompts = [workload.tokens] * workload.prompts
    param_bytes = model.lm_head.weight.element_size()
    rates = Hardware(gpu=gpu).step_rates
    captured = why_not_captured(model, device) is None
    shape = (model.args, prompts, workload.generations, workload.completion_tokens, param_bytes)
    predictions = {"predicted_sampling_s": sampling_seconds(*shape, rates, captured)}
    bandwidth = next((v for k, v in MEMORY_GBPS.items() if k in gpu), None)
    if device.type == "cuda" and bandwidth is not None:
        predictions["sampling_bound_s"] = sampling_bound_seconds(*shape, bandwidth)
    return predictions


def grpo_step_work(workload: Workload, args: ModelArgs) -> dict:
    """A GRPO step's work, the same for every system: its trained tokens and their training
    FLOPs (the sampling's forwards are not counted in MFU), its documents."""
    lora = lora_shape(workload_lora(workload), args)
    length = workload.tokens + workload.completion_tokens
    tokens = trained_tokens(workload)
    return {
        "tokens_per_step": tokens,
        "flops_per_step": tokens * training_flops_per_token(args, length, lora),
        "documents_per_step": workload.prompts * workload.generations,
    }
