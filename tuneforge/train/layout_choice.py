"""The parallel layout a run uses: as configured, or for `parallel.strategy: auto` on several processes
the planner's choice (`plan/strategy.py`) from the model's predicted memory for the run's own
documents and the first rank's GPU, which every rank then follows."""

import logging
from typing import Any

import torch
import torch.distributed as dist

from tuneforge.config import RunConfig
from tuneforge.data.length_policy import RecordLengths
from tuneforge.hardware.gpus import GIB
from tuneforge.parallel.distributed import Dist, configured_dims
from tuneforge.parallel_dims import ParallelDims
from tuneforge.plan.planner import replicated_memory_gib
from tuneforge.plan.prediction import Hardware
from tuneforge.plan.strategy import resolve_dims

log = logging.getLogger(__name__)


def choose_dims(
    config: RunConfig, world: Dist, records: RecordLengths | None = None
) -> ParallelDims:
    """`records`: the records' tokenised lengths (the data's statistics), as `tuneforge plan`
    reads them, so both predict the same memory."""
    configured = configured_dims(config.parallel, world)  # refuses `single` on several processes
    if config.parallel.strategy != "auto" or world.world_size == 1 or configured.on_mesh:
        return configured
    gpu_gib = None
    if world.device.type == "cuda":
        gpu_gib = torch.cuda.get_device_properties(world.device).total_memory / GIB
    # the name only picks the platform's runtime overhead in the prediction
    hardware = Hardware(
        gpus=world.world_size, gpu="MI300X" if torch.version.hip else "H100", memory_gib=gpu_gib
    )
    replicated = replicated_memory_gib(config, hardware, records)
    decision: list[Any] = list(resolve_dims(config.parallel, world.world_size, replicated, gpu_gib))
    if dist.is_initialized():  # one choice for all, were the GPUs of different sizes
        dist.broadcast_object_list(decision, src=0)
    dims, why = decision
    if world.is_main:
        log.info("parallel.strategy auto: %s (%s)", dims.strategy, why)
    return dims
