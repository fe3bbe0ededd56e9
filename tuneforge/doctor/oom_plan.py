"""For an out-of-memory run with a known configuration: how much each remedy saves, from the
planner (the compiled blocks' memory budget, activation checkpointing, ZeRO-3, more tensor or
expert parallelism, a LoRA base held
in FP8 or in 4 bits, lighter master weights, a halved micro-batch), given the GPU's capacity from the error message. The planner gets the same
documents `tuneforge plan` gives it (the data's lengths), so the two agree."""

from dataclasses import replace
from typing import TYPE_CHECKING

from tuneforge.config import RunConfig
from tuneforge.config.loading import reload_config
from tuneforge.hardware.gpus import GIB
from tuneforge.mesh_rules import MeshSizes, mesh_problems
from tuneforge.plan.memory_options import COMPILE_BUDGET
from tuneforge.plan.planner import plan_run, run_model_args
from tuneforge.plan.prediction import Hardware
from tuneforge.precision.trained_weights import TrainedWeights

if TYPE_CHECKING:
    from tuneforge.data.length_policy import RecordLengths


def remedies(
    config: RunConfig,
    gpus: int,
    capacity_gib: float | None,
    records: "RecordLengths | None" = None,
) -> list[str]:
    """One line per remedy: predicted GiB per GPU before and after, and whether it then fits."""
    hardware = Hardware(gpus=gpus, memory_gib=capacity_gib)
    current = plan_run(config, hardware, records).memory.total / GIB
    train = config.train
    options: dict[str, tuple[list[str], str]] = {}
    if (
        train.compile
        and train.activation_checkpointing == "none"
        and train.compile_memory_budget > COMPILE_BUDGET
    ):
        options["budget"] = (
            [f"train.compile_memory_budget={COMPILE_BUDGET}"],
            f"a memory budget of {COMPILE_BUDGET} for the compiled blocks (about 1% slower)",
        )
    if train.activation_checkpointing != "full":
        options["checkpointing"] = (
            ["train.activation_checkpointing=full"],
            "activation checkpointing on every block",
        )
    if gpus > 1:
        options["zero3"] = (
            ["parallel.strategy=fsdp", "parallel.zero_stage=3"],
            "ZeRO-3 (parallel.strategy: fsdp, zero_stage: 3)",
        )
    precision = config.precision
    lora_in_bf16 = config.lora.enabled and config.model.dtype == "bfloat16"
    held_low = precision.fp4 or precision.fp8_base_weights or config.model.quantize
    if lora_in_bf16 and not held_low:
        options["fp8_base"] = (
            ["precision.fp8=" + (precision.fp8 or "e4m3"), "precision.fp8_base_weights=true"],
            "the frozen base held only in FP8 (precision.fp8, fp8_base_weights: true; GPUs "
            "with FP8 tensor cores, see docs/precision.md)",
        )
    if config.lora.enabled and not (config.model.quantize or precision.fp8 or precision.fp4):
        options["qlora"] = (
            ["model.quantize=nf4"],
            "QLoRA: the frozen base in 4 bits (model.quantize: nf4; bitsandbytes, slower "
            "products: see docs/lora-and-export.md)",
        )
    options |= _mesh_remedies(config, gpus)
    options |= _lighter_master_weights(config)
    options["half"] = _halved_micro_batch(config.train.tokens_per_micro_batch, config.data)
    lines = [f"the planner predicts {current:.1f} GiB per GPU for this configuration"]
    for changes, label in options.values():
        changed = reload_config(config, changes)
        after = plan_run(changed, hardware, records).memory.total / GIB
        fits = capacity_gib is None or after <= capacity_gib
        lines.append(
            f"{label}: {current:.1f} -> {after:.1f} GiB ({after - current:+.1f})"
            + ("" if capacity_gib is None else (", fits" if fits else ", still too much"))
        )
    return lines


def _mesh_remedies(config, gpus: int) -> dict[str, tuple[list[str], str]]:
    """Twice the tensor parallelism (each GPU a share of every layer's heads and MLP), and for
    an MoE model twice the expert parallelism, where the model and the GPUs take them."""
    parallel, split = config.parallel, run_model_args(config).split_sizes()
    sizes = MeshSizes(
        gpus,
        parallel.tensor_parallel,
        parallel.expert_parallel,
        parallel.data_parallel_replicate,
    )
    options: dict[str, tuple[list[str], str]] = {}
    for field, key, what in (
        ("tensor", "tensor_parallel", "tensor parallelism"),
        ("expert", "expert_parallel", "expert parallelism"),
    ):
        doubled = replace(sizes, **{field: 2 * getattr(sizes, field)})
        if gpus > 1 and not mesh_problems(doubled, split):
            size = getattr(doubled, field)
            options[field] = (
                ["parallel.strategy=fsdp", f"parallel.{key}={size}"],
                f"{what} over {size} GPUs (parallel.{key}: {size}; docs/parallel.md)",
            )
    return options


def _lighter_master_weights(config) -> dict[str, tuple[list[str], str]]:
    """Full fine-tuning of 16-bit weights over fp32 masters: the cheaper ways to keep them."""
    kind = TrainedWeights.of(config.precision.master_weights, config.model.dtype).kind
    if config.lora.enabled or kind != "master":
        return {}
    return {
        "compensated": (
            ["precision.master_weights=compensated"],
            "bf16 weights with a bf16 remainder instead of fp32 masters "
            "(precision.master_weights: compensated; about 0.83x the speed on the 1B shape)",
        ),
        "pure": (
            ["precision.master_weights=false"],
            "no master copy, AdamW states in bf16 (precision.master_weights: false; updates "
            "below half a bf16 step are lost)",
        ),
    }


def _halved_micro_batch(tokens: int, data) -> tuple[list[str], str]:
    """Half the micro-batch's tokens; where its documents already fill it, their length too."""
    half = tokens // 2
    keep = "double grad_accum_steps to keep the global batch"
    if half >= data.max_seq_len:
        return [f"train.tokens_per_micro_batch={half}"], f"a micro-batch of {half} tokens ({keep})"
    return (
        [f"train.tokens_per_micro_batch={half}", f"data.max_seq_len={half}"],
        f"a micro-batch of {half} tokens and data.max_seq_len {half} ({keep}; longer records "
        "are cut as data.on_too_long says, or split with data.split_long)",
    )
