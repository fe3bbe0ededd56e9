"""`tuneforge.plan(...)`: memory per GPU by part, step time, ETA and jobs of a run before it
starts, its what-ifs, the layouts of several GPUs and the `--fit` recipes; after the same
preflight as `train`, this machine's own checks aside."""

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tuneforge.api.configuration import ConfigLike, config, reading
from tuneforge.config import ConfigError, RunConfig
from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:
    from tuneforge.data.length_policy import RecordLengths
    from tuneforge.hardware.step_rates import StepRates
    from tuneforge.plan.layouts import Layout
    from tuneforge.plan.prediction import Hardware, Plan
    from tuneforge.plan.recipe_search import Search
    from tuneforge.train.preflight import Inputs

log = logging.getLogger(__name__)


@dataclass
class PlanResult:
    """What `plan` predicts: the run's `plan` (None with `fit_gib`), or the recipes that fit."""

    config: RunConfig
    hardware: "Hardware"
    planned_for: str
    """The hardware in words, and how it was chosen."""
    plan: "Plan | None" = None
    layouts: "list[Layout]" = field(default_factory=list)
    """With several GPUs: every valid layout, the proposed one first."""
    recipes: "Search | None" = None
    """With `fit_gib`: the fastest recipes whose reserved memory fits."""


def plan(
    source: ConfigLike,
    *,
    gpu: str | None = None,
    gpus: int = 1,
    nodes: int = 1,
    gpu_mem: float | None = None,
    time_limit: str | None = None,
    fit_gib: float | None = None,
    what_if: list[str] | tuple[str, ...] = (),
    with_data: bool = True,
    rates: "StepRates | None" = None,
) -> PlanResult:
    """Predict a run on `gpus` × `nodes` GPUs of kind `gpu` (H100, H200, A100, B200, MI250X,
    MI300X, MI355X or CPU; default: the GPU here, else this CPU). `time_limit` (`4h`) counts the
    jobs needed; `what_if` overrides are each planned against the run; `fit_gib` searches the
    fastest recipes that fit in that many GiB instead. Without the data (`with_data=False`) the
    steps of an epoch are unknown. Raises `ConfigError` for what `train` would refuse."""
    from tuneforge.config.durations import parse_duration
    from tuneforge.plan.prediction import Hardware

    with reading(with_data):  # a configuration's mistakes reported before the heavy imports
        loaded = config(source)
    checked = preflight_for_plan(loaded, with_data, gpus * nodes)
    lengths = checked.data.stats.records if checked.data is not None else None
    gpu, target = target_hardware(gpu)
    refuse_unknown_gpu(gpu, gpu_mem)
    try:
        limit = parse_duration(time_limit) if time_limit else None
    except ValueError as error:
        raise TuneforgeError(f"--time-limit: {error}") from None
    hardware = Hardware(gpus, nodes, gpu, gpu_mem, limit)
    if rates is not None:
        hardware = replace(hardware, rates=rates)
    result = PlanResult(loaded, hardware, target)
    with reading(with_data):  # a hub model's configuration and tokenizer are enough to plan
        if fit_gib is not None:
            result.recipes = _recipes(loaded, hardware, lengths, fit_gib)
            return result
        from tuneforge.plan.planner import plan_config

        result.plan = plan_config(loaded, hardware, lengths, list(what_if))
        if hardware.data_parallel > 1:
            from tuneforge.plan.layouts import plan_layouts

            result.layouts = plan_layouts(loaded, hardware, lengths)
    return result


def _recipes(loaded: RunConfig, hardware: "Hardware", lengths, fit_gib: float) -> "Search":
    from tuneforge.hardware.gpus import GPU_MEMORY_GIB
    from tuneforge.plan.recipe_search import search_recipes

    capacity = hardware.memory_gib or GPU_MEMORY_GIB.get(hardware.gpu)
    if capacity is not None and fit_gib > capacity:
        raise TuneforgeError(
            f"--fit {fit_gib:g}: more than the {capacity:g} GiB a {hardware.gpu} has; give at "
            f"most {capacity:g} (or --gpu / --gpu-mem for a larger GPU)"
        )
    return search_recipes(loaded, hardware, lengths, fit_gib)


def record_lengths(loaded: RunConfig) -> "RecordLengths | None":
    """The training records' lengths and targets (through the cache), or None, with a warning,
    where the data cannot be read: the planner then takes documents of max_seq_len."""
    from tuneforge.train.build import load_tokenizer, read_training_data

    try:
        return read_training_data(loaded, load_tokenizer(loaded)).stats.records
    except TuneforgeError as error:
        log.warning("data not used (%s); documents assumed max_seq_len long", error)
        return None


def preflight_for_plan(loaded: RunConfig, with_data: bool, world_size: int) -> "Inputs":
    """What `train` would refuse before any weights load, refused here first (this machine's
    packages and GPU aside: a plan is often made elsewhere)."""
    from tuneforge.train.preflight import Inputs, issues_of

    with reading(with_data):
        inputs = Inputs(loaded, world_size=world_size)
        found = issues_of(inputs, with_data, machine=False)
    if found:
        raise ConfigError(found)
    return inputs


def refuse_unknown_gpu(gpu: str, gpu_mem: float | None) -> None:
    """A GPU the tables do not know is planned for only with its memory given."""
    from tuneforge.hardware.gpus import GPU_MEMORY_GIB
    from tuneforge.plan.prediction import CPU

    if gpu not in GPU_MEMORY_GIB and gpu != CPU and gpu_mem is None:
        raise TuneforgeError(
            f"--gpu {gpu}: unknown; use one of {', '.join(GPU_MEMORY_GIB)} or CPU, or give "
            "the GPU's memory (--gpu-mem; gpu_mem= from Python)"
        )


def target_hardware(gpu: str | None) -> tuple[str, str]:
    """The hardware to plan for and how it was chosen: as asked, else the GPU here (by its name
    in the tables), else this machine's CPU."""
    from tuneforge.hardware.cpu import cpu_cores
    from tuneforge.hardware.gpus import table_name_of
    from tuneforge.plan.prediction import CPU

    if gpu is not None:
        name = CPU if gpu.lower() == "cpu" else gpu
        return name, (f"this machine's CPU ({cpu_cores()} cores)" if name == CPU else name)
    import torch

    if torch.cuda.is_available():
        here = torch.cuda.get_device_name()
        known = table_name_of(here)
        if known is not None:
            return known, f"{known}, the GPU here ({here}); --gpu plans for another"
        return "H100", f"H100: the GPU here ({here}) is not in the tables; pass --gpu and --gpu-mem"
    return CPU, f"this machine's CPU ({cpu_cores()} cores, no GPU here); --gpu plans for a GPU"
