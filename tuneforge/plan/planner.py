"""`tuneforge plan`: will this run fit, how long will it take, how many jobs does it need, and
what would a change do — from the configuration, the model's cost formulas and the dataset's
real lengths, before any GPU is used."""

import logging
import math
from dataclasses import replace

import numpy as np

from tuneforge.config import RunConfig
from tuneforge.config.durations import parse_duration
from tuneforge.config.errors import ConfigError, ConfigIssue
from tuneforge.config.loading import reload_config
from tuneforge.config.objectives.registry import declaration_of
from tuneforge.data.length_policy import RecordLengths
from tuneforge.hardware.gpus import GIB, link_gbps
from tuneforge.mesh_rules import MESH_FIX, MeshSizes, mesh_problems_by_key
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    activation_bytes_per_token,
    attention_activation_bytes_per_token,
    parameter_count,
    training_flops_per_token,
)
from tuneforge.peft.selection import lora_shape
from tuneforge.plan.advice import advise
from tuneforge.plan.base_weights import BaseWeights
from tuneforge.plan.frozen_models import (
    describe_frozen_models,
    frozen_models,
    holds_frozen_copy,
    own_weight_bytes,
    section_model_args,
)
from tuneforge.plan.memory import Setup, generation_cache_bytes, predict_memory
from tuneforge.plan.memory_options import memory_options
from tuneforge.plan.policies import reshard_after_forward
from tuneforge.plan.prediction import Hardware, Plan
from tuneforge.plan.rank_wait import rank_waits
from tuneforge.plan.step_estimate import estimate_step
from tuneforge.plan.step_time import StepTime, mean_step
from tuneforge.plan.strategy import resolve_dims
from tuneforge.plan.traffic import collective_bytes, collective_spans
from tuneforge.plan.workload import (
    Workload,
    documents_of,
    epoch_workload,
    mean_document_length,
)
from tuneforge.precision.trained_weights import TrainedWeights

log = logging.getLogger(__name__)

SAMPLED_STEPS = 32
"""Steps of the epoch the step time is averaged over (spread evenly through it)."""
LENGTH_ROUNDING = 64
DENSE_ZERO2_MAX_PARAMS = 13e9
MOE_ZERO2_MAX_PARAMS = 30e9


def run_model_args(config: RunConfig) -> ModelArgs:
    return section_model_args(config.model)


def fsdp_stage_of(config: RunConfig, hardware: Hardware) -> int:
    """The stage the run uses unless `auto` picks DDP: 0 on one GPU or with DDP; FSDP2 is 2 or
    3."""
    if hardware.data_parallel == 1 or config.parallel.strategy in ("single", "ddp"):
        return 0
    return 3 if reshard_after_forward(config.parallel) else 2


def replicated_memory_gib(
    config: RunConfig, hardware: Hardware, records: RecordLengths | None = None
) -> float:
    """Per-GPU GiB of the run with the whole model on every GPU (DDP), for the records'
    tokenised lengths as `plan_run` predicts it (documents as long as `data.max_seq_len`
    without them)."""
    args = run_model_args(config)
    setup = setup_of(config, args, hardware, mean_document_length(config.data, records))
    return predict_memory(replace(setup, zero_stage=0)).total / GIB


def zero_stage_advice(args: ModelArgs, data_parallel: int) -> tuple[int, str]:
    """The LUMI-G report's table: dense up to 13B and MoE up to 30B total on ZeRO-2, larger on 3."""
    if data_parallel == 1:
        return 0, "one GPU: nothing to shard"
    total = args.num_params()
    if args.moe is not None:
        stage = 3 if total > MOE_ZERO2_MAX_PARAMS else 2
        kind = f"sparse MoE with {parameter_count(total)} parameters in total"
    else:
        stage = 3 if total > DENSE_ZERO2_MAX_PARAMS else 2
        kind = f"dense model of {parameter_count(total)} parameters"
    return stage, f"ZeRO-{stage} (parallel.zero_stage: {stage}): {kind}"


def setup_of(config: RunConfig, args: ModelArgs, hardware: Hardware, mean_doc_len: float) -> Setup:
    lora = lora_shape(config.lora, args)
    attention = "eager" if config.model.attention == "eager" else "flash"
    stage = fsdp_stage_of(config, hardware)
    sharded_ranks = hardware.data_parallel if stage >= 2 else 1  # frozen blocks under FSDP2
    parallel = config.parallel
    mesh = hardware.data_parallel > 1 and (
        max(parallel.tensor_parallel, parallel.expert_parallel, parallel.data_parallel_replicate)
        > 1
    )
    tensor = parallel.tensor_parallel if mesh else 1
    samples, generated = declaration_of(config).sampling(config)
    read = config.train.tokens_per_micro_batch
    param_bytes = 4 if config.model.dtype == "float32" else 2
    sequences = samples * read / max(mean_doc_len, 1.0) if generated else 0.0
    return Setup(
        args=args,
        param_bytes=param_bytes,
        tokens_per_micro_batch=read * samples,  # each record's prompt once per sample
        generation_cache_bytes=generation_cache_bytes(
            args, sequences, mean_doc_len + generated, param_bytes
        ),
        lora=lora,
        checkpointing=config.train.activation_checkpointing,
        checkpoint_every=config.train.checkpoint_every,
        offload_checkpoints=config.train.offload_checkpoints,
        offload_activations=config.train.offload_activations,
        keep_activations=config.train.keep_activations,
        offload_embedding=config.train.offload_embedding,
        attention=attention,
        mean_doc_len=mean_doc_len,
        data_parallel=hardware.data_parallel // tensor,
        zero_stage=max(stage, 2) if mesh else stage,  # a mesh always runs FSDP2
        trained=TrainedWeights.of(config.precision.master_weights, config.model.dtype),
        platform=hardware.platform,
        grad_accum_steps=config.train.grad_accum_steps,
        loss_chunk_tokens=config.train.loss_chunk_tokens,
        compiled=config.train.compile,
        compile_memory_budget=config.train.compile_memory_budget,
        base_weights=(
            BaseWeights.of(config.precision, config.model) if lora is not None else BaseWeights()
        ),
        frozen_copy=holds_frozen_copy(config),
        fp8_inputs=lora is None and bool(config.precision.fp8),
        extra_weight_bytes=sum(own_weight_bytes(f, sharded_ranks) for f in frozen_models(config)),
        tensor=tensor,
        expert=parallel.expert_parallel if mesh else 1,
        replicate=parallel.data_parallel_replicate if mesh else 1,
    )


def largest_budget(setup: Setup, capacity_gib: float) -> int:
    """The largest micro-batch token budget (a multiple of 256) whose memory fits."""

    def fits(tokens: int) -> bool:
        memory = predict_memory(replace(setup, tokens_per_micro_batch=tokens))
        return memory.total <= capacity_gib * GIB

    low, high = 0, 1 << 22  # in units of 256 tokens: memory grows with tokens
    if not fits(256):
        return 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(256 * middle) else (low, middle)
    return 256 * low


def sampled_steps(config: RunConfig, epoch: Workload | None) -> list[list[list[int]]]:
    """Steps of the epoch (each its micro-batches' rows), `SAMPLED_STEPS` of them spread evenly
    through it; without the data's lengths, micro-batches of `data.max_seq_len` documents."""
    train, accum = config.train, config.train.grad_accum_steps
    if epoch is not None and epoch.micro_batch_lengths:
        rows = epoch.micro_batch_lengths
        starts = range(0, max(len(rows) - accum + 1, 1), max(1, len(rows) // SAMPLED_STEPS))
        return [[rows[(start + k) % len(rows)] for k in range(accum)] for start in starts][
            :SAMPLED_STEPS
        ]
    length = min(config.data.max_seq_len, train.tokens_per_micro_batch)
    return [[[length] * max(1, train.tokens_per_micro_batch // length)] * accum]


def planned_step(
    config: RunConfig, setup: Setup, hardware: Hardware, epoch: Workload | None
) -> StepTime:
    """The mean of the sampled steps' times at the hardware's rates, each collective over the
    links its group spans (within a node, or across nodes)."""
    within, between = link_gbps(hardware.gpu)
    spans = collective_spans(setup.tensor, setup.expert, hardware.data_parallel, setup.replicate)
    links = {name: between if span > hardware.gpus else within for name, span in spans.items()}
    steps = sampled_steps(config, epoch)
    rates = hardware.step_rates
    return mean_step([estimate_step(config, setup, step, rates, links) for step in steps])


def jobs_needed(eta_s: float, time_limit_s: float, margin_s: float) -> int:
    return max(1, math.ceil(eta_s / max(time_limit_s - margin_s, 1.0)))


def planned_epoch(config: RunConfig, records: RecordLengths | None) -> Workload | None:
    """The epoch's micro-batches from the records' lengths (None without them)."""
    if records is None or not records.lengths:
        return None
    args, data, train = run_model_args(config), config.data, config.train
    return epoch_workload(
        args,
        documents_of(data, records),
        train.tokens_per_micro_batch,
        data.packing,
        lora_shape(config.lora, args),
        train.seed,
    )


def plan_run(
    config: RunConfig,
    hardware: Hardware,
    records: RecordLengths | None = None,
) -> Plan:
    args = run_model_args(config)
    train = config.train
    epoch = planned_epoch(config, records)
    setup = setup_of(config, args, hardware, mean_document_length(config.data, records))
    capacity = hardware.gpu_memory_gib
    sizes = MeshSizes(hardware.data_parallel, setup.tensor, setup.expert, setup.replicate)
    refused = mesh_problems_by_key(sizes, args.split_sizes())
    if refused:  # no layout to plan, as `train` would start none (a --what-if can ask for one)
        raise ConfigError([ConfigIssue(key, problem, MESH_FIX) for key, problem in refused])
    replicated = predict_memory(replace(setup, zero_stage=0)).total / GIB
    dims, strategy_reason = resolve_dims(
        config.parallel, hardware.data_parallel, replicated, capacity
    )
    if dims.replicated:
        setup = replace(setup, zero_stage=0)
    memory = predict_memory(setup)
    stage, stage_advice = zero_stage_advice(args, hardware.data_parallel)

    options = memory_options(setup, capacity, replicated)
    reduce_bytes = 4 if config.parallel.reduce_dtype == "float32" else setup.param_bytes
    needs_checkpointing = options.without_checkpointing > capacity >= options.full_checkpointing
    micro_batches_per_epoch = epoch.micro_batches if epoch is not None else None
    timed = planned_step(config, setup, hardware, epoch)
    step_time = timed.total_s
    waits = rank_waits(epoch, config, hardware.data_parallel) if epoch else (1.0, 1.0)
    step_time *= waits[0]
    collectives = collective_bytes(setup, reduce_bytes)
    if train.max_steps is not None:
        steps = train.max_steps
    elif micro_batches_per_epoch is not None:
        per_step = train.grad_accum_steps * hardware.data_parallel
        steps = max(1, math.ceil((train.epochs or 1) * micro_batches_per_epoch / per_step))
    else:
        steps = None  # epochs of data the plan has not read
    eta_s = steps * step_time if steps is not None else None
    plan = Plan(
        memory=memory,
        gpu_memory_gib=capacity,
        fits=memory.total / GIB <= capacity,
        zero_stage=setup.zero_stage,
        zero_stage_advice=stage_advice,
        gradient_checkpointing_needed=needs_checkpointing,
        largest_micro_batch_tokens=largest_budget(setup, capacity),
        step_time_s=step_time,
        steps=steps,
        step_parts=timed.parts,
        step_bound=timed.bound,
        clock=timed.clock,
        rates=timed.rates,
        eta_h=eta_s / 3600 if eta_s is not None else None,
        jobs_needed=None,
        epoch=epoch,
        collective_gb_per_step=sum(collectives.values()) / 1e9,
        collectives_gb={name: value / 1e9 for name, value in collectives.items()},
        strategy=dims.describe(),
        strategy_reason=strategy_reason,
        slowest_rank_factor=waits[0],
        balanced_slowest_rank_factor=waits[1],
        tokens_per_step=train.grad_accum_steps
        * (
            epoch.real_tokens / max(epoch.micro_batches, 1)
            if epoch is not None
            else train.tokens_per_micro_batch
        ),
    )
    if records is not None and records.lengths:
        p99 = float(np.percentile(records.lengths, 99))
        plan.suggested_max_seq_len = max(
            LENGTH_ROUNDING, math.ceil(p99 / LENGTH_ROUNDING) * LENGTH_ROUNDING
        )
    plan.per_token, plan.model = _per_token_and_model(args, setup)
    plan.base_weights = setup.base_weights.describe(args, setup.param_bytes)
    plan.objective = describe_frozen_models(config, args, setup.param_bytes)
    margin = config.checkpoint.exit_margin_s
    limit = hardware.time_limit_s or (
        parse_duration(train.time_limit) if train.time_limit else None
    )
    if limit is not None:
        plan.jobs_needed = jobs_needed(eta_s, limit, margin) if eta_s is not None else None
        steps_per_job = int((limit - margin) / step_time) if step_time > 0 else steps or 1
        save_steps = config.checkpoint.save_steps
        if save_steps is not None and save_steps > steps_per_job:
            plan.problems.append(
                f"checkpoint.save_steps={save_steps} exceeds the ~{steps_per_job} steps one job "
                f"can do: set it to at most {max(1, steps_per_job // 2)}"
            )
    advise(plan, config, hardware, stage, options)
    return plan


def _per_token_and_model(args: ModelArgs, setup: Setup) -> tuple[dict, dict]:
    """Per-token costs from the model's formulas, and the model's size."""
    kept = sum(
        activation_bytes_per_token(args, layer, "none", setup.param_bytes, setup.lora)
        for layer in range(args.num_layers)
    )
    per_token = {
        "training_gflop": training_flops_per_token(args, round(setup.mean_doc_len), setup.lora)
        / 1e9,
        "activation_mib": kept / 2**20,
        "attention_kib_per_layer": attention_activation_bytes_per_token(args, setup.param_bytes)
        / 2**10,
    }
    model = {
        "params_b": args.num_params() / 1e9,
        "active_params_b": args.num_params(active=True) / 1e9,
        "dim": args.dim,
        "layers": args.num_layers,
    }
    return per_token, model


def _seconds_per_token(plan: Plan) -> float:
    """A step's predicted time over the real tokens it trains: what a change to the micro-batch,
    the packing or the recomputation does to the speed, whatever it does to the step count."""
    return plan.step_time_s / max(plan.tokens_per_step, 1.0)


def plan_config(
    config: RunConfig,
    hardware: Hardware,
    records: RecordLengths | None,
    what_if: list[str],
) -> Plan:
    """The plan of a configuration, and of each `what_if` change (an override) relative to it."""
    base = plan_run(config, hardware, records)
    for change in what_if:
        changed = plan_run(reload_config(config, [change]), hardware, records)
        old, new = _seconds_per_token(base), _seconds_per_token(changed)
        base.what_if.append(
            {
                "change": change,
                "speedup": old / new if new else None,
                "memory_ratio": changed.memory.total / base.memory.total,
                "memory_gib": changed.memory.total / GIB,
                "fits": changed.fits,
            }
        )
    return base
