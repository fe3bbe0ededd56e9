"""`tuneforge plan`: will this run fit, how long will it take, how many jobs does it need, and
what would a change do — from the configuration, the model's cost formulas and the dataset's
real lengths, before any GPU is used."""

import logging
import math
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuneforge.config import RunConfig, load_config
from tuneforge.config.durations import parse_duration
from tuneforge.config.objectives import preference_reference_kind, teacher_runs_online
from tuneforge.config.schema import ModelSection
from tuneforge.data.length_policy import RecordLengths
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import GIB
from tuneforge.models.api import model_args
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    activation_bytes_per_token,
    attention_activation_bytes_per_token,
    forward_flops_per_token,
    parameter_count,
    training_flops_per_token,
)
from tuneforge.peft.selection import lora_shape
from tuneforge.plan.advice import advise
from tuneforge.plan.base_weights import BaseWeights, frozen_linears
from tuneforge.plan.memory import Setup, frozen_weight_bytes, predict_memory
from tuneforge.plan.memory_options import memory_options, recomputed
from tuneforge.plan.plan import Hardware, Plan
from tuneforge.plan.policies import reshard_after_forward
from tuneforge.plan.rank_wait import rank_waits
from tuneforge.plan.strategy import resolve_strategy
from tuneforge.plan.traffic import step_traffic_bytes
from tuneforge.plan.workload import (
    documents_of,
    epoch_workload,
    mean_document_length,
)
from tuneforge.precision.trained_weights import TrainedWeights
from tuneforge.runs.files import read_metrics

log = logging.getLogger(__name__)

DEFAULT_MFU = 0.40
"""Share of peak FLOP/s assumed without a measured run (`--calibrate RUN_DIR` replaces it)."""
LENGTH_ROUNDING = 64
DENSE_ZERO2_MAX_PARAMS = 13e9
MOE_ZERO2_MAX_PARAMS = 30e9


def run_model_args(config: RunConfig) -> ModelArgs:
    return section_model_args(config.model)


def section_model_args(section: ModelSection) -> ModelArgs:
    source = section.path if section.path is not None else section.name
    assert source is not None  # guaranteed by the config rules
    return model_args(source, section.num_layers)


def teacher_cost(config: RunConfig, length: int, ranks: int = 1) -> tuple[float, float] | None:
    """A distillation run's teacher held beside the student: (its weights' bytes per GPU, its
    blocks sharded across `ranks` under FSDP2; its forward FLOPs per token); None without one
    (a cached teacher runs once, before training)."""
    teacher = config.distill.teacher
    if not teacher_runs_online(config) or teacher is None:
        return None
    args = section_model_args(teacher)
    param_bytes = 4 if teacher.dtype == "float32" else 2
    weights = frozen_weight_bytes(args, param_bytes, ranks)
    if teacher.quantize:  # its linears in 4 bits, held whole on every rank (buffers, not sharded)
        four_bit = BaseWeights(f"bnb-{teacher.quantize}", double_quant=teacher.double_quant)
        weights += sum(four_bit.bytes(args, param_bytes))
        weights -= frozen_linears(args)[0] * param_bytes / ranks
    return weights, forward_flops_per_token(args, length)


def fsdp_stage_of(config: RunConfig, hardware: Hardware) -> int:
    """The stage the run uses unless `auto` picks DDP: 0 on one GPU or with DDP; FSDP2 is 2 or
    3."""
    strategy = config.parallel.strategy
    if hardware.data_parallel == 1 or strategy in ("single", "ddp"):
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
    return Setup(
        args=args,
        param_bytes=4 if config.model.dtype == "float32" else 2,
        tokens_per_micro_batch=config.train.tokens_per_micro_batch,
        lora=lora,
        checkpointing=config.train.activation_checkpointing,
        checkpoint_every=config.train.checkpoint_every,
        offload_checkpoints=config.train.offload_checkpoints,
        offload_activations=config.train.offload_activations,
        keep_activations=config.train.keep_activations,
        offload_embedding=config.train.offload_embedding,
        attention=attention,
        mean_doc_len=mean_doc_len,
        data_parallel=hardware.data_parallel,
        zero_stage=stage,
        trained=TrainedWeights.of(config.precision.master_weights, config.model.dtype),
        platform=hardware.platform,
        grad_accum_steps=config.train.grad_accum_steps,
        loss_chunk_tokens=config.train.loss_chunk_tokens,
        compiled=config.train.compile,
        compile_memory_budget=config.train.compile_memory_budget,
        base_weights=(
            BaseWeights.of(config.precision, config.model) if lora is not None else BaseWeights()
        ),
        frozen_copy=preference_reference_kind(config) == "frozen_copy",
        extra_weight_bytes=(teacher_cost(config, 1, sharded_ranks) or (0.0, 0.0))[0],
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


def measured_mfu(run_dir: Path) -> float:
    file = run_dir / "metrics.jsonl"
    records = [r for r in read_metrics(file) if r.get("mfu")] if file.is_file() else []
    if not records:
        raise TuneforgeError(f"{file} has no MFU figures (a GPU run of tuneforge writes them)")
    steady = records[len(records) // 4 :] or records
    # weighted by each step's time: the useful FLOPs over the time they took (packed batches
    # differ in cost; a median of the steps' MFU would count the common batches only)
    seconds = [r.get("step_s") or 0.0 for r in steady]
    if sum(seconds) <= 0:
        return statistics.median(r["mfu"] for r in steady)
    return sum(r["mfu"] * s for r, s in zip(steady, seconds, strict=True)) / sum(seconds)


def jobs_needed(eta_s: float, time_limit_s: float, margin_s: float) -> int:
    return max(1, math.ceil(eta_s / max(time_limit_s - margin_s, 1.0)))


def plan_run(
    config: RunConfig,
    hardware: Hardware,
    records: RecordLengths | None = None,
) -> Plan:
    args = run_model_args(config)
    data, train = config.data, config.train
    epoch = None
    if records is not None and records.lengths:
        lengths = documents_of(data, records)
        epoch = epoch_workload(
            args,
            lengths,
            train.tokens_per_micro_batch,
            data.packing,
            lora_shape(config.lora, args),
            train.seed,
        )
    setup = setup_of(config, args, hardware, mean_document_length(config.data, records))
    capacity = hardware.gpu_memory_gib
    replicated = predict_memory(replace(setup, zero_stage=0)).total / GIB
    strategy, strategy_reason = resolve_strategy(
        config.parallel, hardware.data_parallel, replicated, capacity
    )
    if strategy == "ddp":
        setup = replace(setup, zero_stage=0)
    memory = predict_memory(setup)
    stage, stage_advice = zero_stage_advice(args, hardware.data_parallel)

    options = memory_options(setup, capacity, replicated)
    reduce_bytes = 4 if config.parallel.reduce_dtype == "float32" else setup.param_bytes
    needs_checkpointing = options.without_checkpointing > capacity >= options.full_checkpointing
    peak = hardware.peak_tflops * 1e12
    mfu = hardware.mfu or DEFAULT_MFU
    if epoch is not None:
        flops_per_micro_batch = epoch.flops / max(epoch.micro_batches, 1)
        micro_batches_per_epoch = epoch.micro_batches
    else:
        flops_per_micro_batch = train.tokens_per_micro_batch * training_flops_per_token(
            args, data.max_seq_len, setup.lora
        )
        micro_batches_per_epoch = None
    # forwards of every token without gradients: a preference run's reference, a teacher
    length = round(setup.mean_doc_len) or data.max_seq_len
    reference = preference_reference_kind(config)
    teacher = teacher_cost(config, length)
    per_step_reference = reference is not None and reference != "precomputed"
    frozen_forwards = (forward_flops_per_token(args, length) if per_step_reference else 0.0) + (
        teacher[1] if teacher else 0.0
    )
    flops_per_micro_batch *= 1 + frozen_forwards / training_flops_per_token(
        args, length, setup.lora
    )
    if setup.checkpointing != "none":  # recomputation: another forward of the checkpointed blocks
        share = len([i for i in range(args.num_layers) if i in recomputed(setup)]) / max(
            args.num_layers, 1
        )
        flops_per_micro_batch *= 1 + share / 3
    step_time = flops_per_micro_batch * train.grad_accum_steps / (peak * mfu)
    waits = rank_waits(epoch, config, hardware.data_parallel) if epoch else (1.0, 1.0)
    step_time *= waits[0]
    if train.max_steps is not None:
        steps = train.max_steps
    elif micro_batches_per_epoch is not None:
        per_step = train.grad_accum_steps * hardware.data_parallel
        steps = max(1, math.ceil((train.epochs or 1) * micro_batches_per_epoch / per_step))
    else:
        steps = 0
    eta_s = steps * step_time
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
        eta_h=eta_s / 3600,
        jobs_needed=None,
        epoch=epoch,
        collective_gb_per_step=step_traffic_bytes(setup, reduce_bytes) / 1e9,
        strategy=strategy,
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
    if teacher is not None:
        plan.objective = (
            f"distillation: the teacher ({teacher[0] / GIB:.2f} GiB of weights) runs a forward of "
            "every token each step"
        )
    plan.objective = plan.objective or frozen_pass_line(config, reference, args, setup.param_bytes)
    margin = config.checkpoint.exit_margin_s
    limit = hardware.time_limit_s or (
        parse_duration(train.time_limit) if train.time_limit else None
    )
    if limit is not None:
        plan.jobs_needed = jobs_needed(eta_s, limit, margin)
        steps_per_job = int((limit - margin) / step_time) if step_time > 0 else steps
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
    config_file: Path,
    overrides: list[str],
    hardware: Hardware,
    records: RecordLengths | None,
    what_if: list[str],
) -> Plan:
    """The plan of a configuration, and of each `what_if` change relative to it."""
    base = plan_run(load_config(config_file, overrides), hardware, records)
    for change in what_if:
        changed = plan_run(load_config(config_file, [*overrides, change]), hardware, records)
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


def frozen_pass_line(
    config: RunConfig, reference: str | None, args: ModelArgs, param_bytes: int
) -> str | None:
    """What a preference run's reference or a cached teacher adds to the run."""
    if reference == "precomputed":
        return (
            f"preference pairs ({config.dpo.loss}): the reference's log-probabilities are "
            "computed in one forward of every token before training and cached; none per step"
        )
    if reference is not None:
        copy = f", its frozen copy {args.num_params() * param_bytes / GIB:.2f} GiB"
        return (
            f"preference pairs ({config.dpo.loss}): the reference ({reference}) runs a forward "
            f"of every token each step{copy if reference == 'frozen_copy' else ''}"
        )
    distill = config.distill
    if config.train.objective == "distill" and distill.teacher_logits == "cached":
        return (
            f"distillation from cached logits: the teacher runs one forward of every token "
            f"before training, alone; its top-{distill.top_k} logits and ids take "
            f"{8 * (distill.top_k or 0)} bytes per supervised token on disk"
        )
    return None
