"""`plan --fit GIB`: the memory and speed options a run can take, each combination's reserved
memory and step time predicted, and the fastest that fit in GIB of reserved memory, with the
overrides to paste. The options are the ones the benchmark's hand-tuned recipes turned:
checkpointing (full, selective, with offloaded inputs), the compiled blocks' memory budget,
blocks' activations and the embedding in host memory, the loss's chunk, an FP8 or 4-bit frozen
base, and the micro-batch's tokens (the step's tokens kept by more accumulation)."""

import itertools
import math
from dataclasses import dataclass, replace

from tuneforge.config import RunConfig
from tuneforge.config.errors import ConfigError
from tuneforge.config.loading import reload_config
from tuneforge.data.length_policy import RecordLengths
from tuneforge.hardware.gpus import GIB
from tuneforge.plan.memory import predict_memory
from tuneforge.plan.planner import (
    mean_document_length,
    plan_run,
    planned_epoch,
    run_model_args,
    sampled_steps,
    setup_of,
)
from tuneforge.plan.prediction import Hardware
from tuneforge.plan.step_estimate import estimate_step
from tuneforge.plan.step_time import mean_step

SHOWN = 5
HEADROOM_GIB = 0.25
"""Kept free under the hold: within it, fragmentation decides (an FP8-base step predicted at
16.42 GiB ran out of memory under a 16.5 GiB hold with 1.4 GiB cached but unusable)."""
TIE = 0.005
"""Predicted speeds this close are one: the simpler recipe comes first."""
SEARCH_STEPS = 4
"""Sampled steps per candidate while searching; the shown ones are planned in full."""
FP8_GPUS = ("H100", "H200", "B200", "MI300X", "MI355X")
"""GPUs with FP8 tensor cores."""
CUDNN_GPUS = ("H100", "H200", "B200")
"""NVIDIA GPUs whose cuDNN fused attention the benchmark measured faster than flash (Hopper on;
the kernel runs on CUDA only)."""
CHECKPOINTING = (
    {"train.activation_checkpointing": "none"},
    {"train.activation_checkpointing": "selective"},
    {"train.activation_checkpointing": "full"},
    {"train.activation_checkpointing": "full", "train.offload_checkpoints": True},
)
BUDGETS = (1.0, 0.9, 0.8)
HOST_BLOCKS = (0, 4, 8, 10, 12, 14, 16, 18, 20, 24)
LOSS_CHUNKS = (512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Recipe:
    overrides: list[str]
    step_time_s: float
    tokens_per_s: float
    reserved_gib: float
    allocated_gib: float
    bound: str


@dataclass(frozen=True)
class Search:
    recipes: list[Recipe]
    searched: int
    rates: str
    least_gib: float = 0.0
    """The least reserved memory any searched recipe holds."""


def _precisions(config: RunConfig, hardware: Hardware) -> list[dict]:
    """The frozen base's formats a LoRA run may take: as configured, or held in FP8 where the
    GPU has FP8 tensor cores (the precision A/B: within bf16's own spread, docs/precision.md).
    A 4-bit base changes the model the adapters train on: QLoRA recipes are searched when the
    configuration sets `model.quantize` itself."""
    choices: list[dict] = [{}]
    if not config.lora.enabled or config.model.quantize or config.precision.fp8:
        return choices
    if any(name in hardware.gpu for name in FP8_GPUS):
        choices.append({"precision.fp8": "e4m3", "precision.fp8_base_weights": True})
    return choices


def _attention_kernels(config: RunConfig, hardware: Hardware) -> list[dict]:
    """The configured attention, and cuDNN's fused kernels where the GPU has them and the model's
    attention is plain causal attention (what that kernel runs here)."""
    cudnn_runs = any(name in hardware.gpu for name in CUDNN_GPUS)
    configurable = config.model.attention in ("auto", "varlen")
    if cudnn_runs and configurable and run_model_args(config).plain_attention:
        return [{}, {"model.attention": "cudnn"}]
    return [{}]


def _micro_batches(config: RunConfig) -> list[dict]:
    """The configured micro-batch, and half of it with twice the accumulation where packing
    still takes a whole document."""
    train = config.train
    choices: list[dict] = [{}]
    half = train.tokens_per_micro_batch // 2
    if half >= config.data.max_seq_len and half % 256 == 0:
        choices.append(
            {
                "train.tokens_per_micro_batch": half,
                "train.grad_accum_steps": 2 * train.grad_accum_steps,
            }
        )
    return choices


def candidates(config: RunConfig, hardware: Hardware) -> list[dict]:
    """Every combination of the options that makes sense for this run."""
    args = run_model_args(config)
    lora, tied = config.lora.enabled, args.tie_embeddings
    out = []
    for precision, attention, checkpointing, budget, host, embed, chunk, micro in itertools.product(
        _precisions(config, hardware),
        _attention_kernels(config, hardware),
        CHECKPOINTING,
        BUDGETS,
        [n for n in HOST_BLOCKS if n < args.num_layers],
        (False, True) if lora and not tied else (False,),
        LOSS_CHUNKS,
        _micro_batches(config),
    ):
        if budget < 1.0 and checkpointing["train.activation_checkpointing"] != "none" and host == 0:
            continue  # the budget acts on blocks that keep their activations
        if attention and (
            budget < 1.0 or checkpointing["train.activation_checkpointing"] != "none"
        ):
            continue  # measured with every activation kept: under a budget cuDNN keeps more
        choice = {"train.compile": True, **precision, **attention, **checkpointing, **micro}
        choice |= {
            "train.compile_memory_budget": budget,
            "train.offload_activations": host,
            "train.offload_embedding": embed,
            "train.loss_chunk_tokens": chunk,
        }
        out.append(choice)
    return out


def _configured(config: RunConfig, choice: dict) -> RunConfig:
    """`config` with the dotted `choice` set (not validated: the shown ones are, by loading)."""
    sections: dict[str, dict] = {}
    for key, value in choice.items():
        section, field = key.split(".")
        sections.setdefault(section, {})[field] = value
    return config.model_copy(
        update={
            name: getattr(config, name).model_copy(update=fields)
            for name, fields in sections.items()
        }
    )


def _overrides(config: RunConfig, choice: dict) -> list[str]:
    """The settings of `choice` that differ from the configuration, as dotted overrides."""
    out = []
    for key, value in choice.items():
        section, field = key.split(".")
        if getattr(getattr(config, section), field) != value:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out.append(f"{key}={text}")
    return out


def search_recipes(
    config: RunConfig, hardware: Hardware, records: RecordLengths | None, fit_gib: float
) -> Search:
    args = run_model_args(config)
    mean_doc = mean_document_length(config.data, records)
    rates = hardware.step_rates
    epochs: dict[int, list] = {}
    scored = []
    choices = candidates(config, hardware)
    least = float("inf")
    for choice in choices:
        changed = _configured(config, choice)
        setup = setup_of(changed, args, hardware, mean_doc)
        memory = predict_memory(setup)
        least = min(least, memory.reserved / GIB)
        if memory.reserved / GIB > fit_gib - HEADROOM_GIB:
            continue
        tokens = changed.train.tokens_per_micro_batch
        if tokens not in epochs:
            epochs[tokens] = sampled_steps(changed, planned_epoch(changed, records))
        steps = epochs[tokens][:: max(1, len(epochs[tokens]) // SEARCH_STEPS)]
        time = mean_step([estimate_step(changed, setup, step, rates) for step in steps])
        step_tokens = sum(sum(sum(m) for m in step) for step in steps) / len(steps)
        changes = len(_overrides(config, choice))
        scored.append((time.total_s / step_tokens, changes, memory.reserved, choice))
    # within the model's resolution, the recipe that changes least first (each option has costs
    # the model may not see: host memory, allocator pressure), then the one that holds less
    scored.sort(key=lambda item: (math.floor(math.log(item[0]) / math.log(1 + TIE)), *item[1:3]))
    recipes: list[Recipe] = []
    seen: set[tuple[str, ...]] = set()
    for *_, choice in scored:
        pasted = _overrides(config, choice)
        if tuple(sorted(pasted)) in seen:
            continue  # another choice that changes the configuration the same way
        seen.add(tuple(sorted(pasted)))
        try:
            changed = reload_config(config, pasted)
        except ConfigError:
            continue  # a combination the configuration's rules refuse
        plan = plan_run(changed, replace(hardware, memory_gib=fit_gib), records)
        if plan.memory.reserved / GIB > fit_gib - HEADROOM_GIB:
            continue
        recipes.append(
            Recipe(
                pasted,
                plan.step_time_s,
                plan.tokens_per_step / plan.step_time_s if plan.step_time_s else 0.0,
                plan.memory.reserved / GIB,
                plan.memory.allocated / GIB,
                plan.step_bound,
            )
        )
        if len(recipes) == SHOWN:
            break
    # planned in full, the shown ones are listed fastest first
    recipes.sort(key=lambda recipe: -recipe.tokens_per_s)
    return Search(recipes, len(choices), rates.name, least)
