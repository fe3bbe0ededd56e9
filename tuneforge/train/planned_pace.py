"""The step time the planner predicts for this run on this machine, which the step-25
projection states beside the measured one (`plan.pace_check`)."""

import logging
from collections.abc import Callable

import torch

from tuneforge.config import RunConfig
from tuneforge.data.length_policy import RecordLengths
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import table_name_of
from tuneforge.parallel.distributed import Dist
from tuneforge.plan.pace_check import PaceCheck
from tuneforge.plan.planner import plan_run
from tuneforge.plan.prediction import Hardware

log = logging.getLogger(__name__)


def machine_gpu(device: torch.device) -> str | None:
    """The GPU tables' name for this device, or None where none matches (or on the CPU, whose
    rates are only scaled from a GPU's: no expectation worth stating)."""
    if device.type != "cuda":
        return None
    return table_name_of(torch.cuda.get_device_name(device))


def planned_pace(
    config: RunConfig, world: Dist, records: RecordLengths | None
) -> Callable[[float], tuple[bool, str, str]] | None:
    """What the projection compares a measured step time with; None where this machine's GPU is
    not in the tables or the planner cannot plan the run (said once, in the log)."""
    gpu = machine_gpu(world.device)
    if gpu is None:
        if world.device.type == "cuda":
            log.info("no step-time rates for this GPU: the projection states the pace only")
        return None
    try:
        plan = plan_run(config, Hardware(gpus=world.world_size, gpu=gpu), records)
    except TuneforgeError as error:
        log.info("the planner cannot predict this run's step time (%s)", error)
        return None

    def compare(measured_s: float) -> tuple[bool, str, str]:
        check = PaceCheck(measured_s, plan.step_time_s, plan.rates, plan.step_bound)
        return check.slow, check.describe(), check.advice()

    return compare
