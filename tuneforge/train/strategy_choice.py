"""The strategy a run uses: as configured, or for `parallel.strategy: auto` on several processes
the planner's choice (`plan/strategy.py`) from the model's predicted memory and this GPU's."""

import logging

import torch

from tuneforge.config import RunConfig
from tuneforge.plan.memory import GIB
from tuneforge.plan.planner import Hardware, replicated_memory_gib
from tuneforge.plan.strategy import resolve_strategy
from tuneforge.train.distributed import Dist, strategy_of

log = logging.getLogger(__name__)


def choose_strategy(config: RunConfig, world: Dist) -> str:
    configured = strategy_of(config.parallel, world)  # refuses `single` on several processes
    if config.parallel.strategy != "auto" or world.world_size == 1:
        return configured
    gpu_gib = None
    if world.device.type == "cuda":
        gpu_gib = torch.cuda.get_device_properties(world.device).total_memory / GIB
    # the name only picks the platform's runtime overhead in the prediction
    hardware = Hardware(
        gpus=world.world_size, gpu="MI300X" if torch.version.hip else "H100", memory_gib=gpu_gib
    )
    replicated = replicated_memory_gib(config, hardware)
    strategy, why = resolve_strategy(config.parallel, world.world_size, replicated, gpu_gib)
    if world.is_main:
        log.info("parallel.strategy auto: %s (%s)", strategy, why)
    return strategy
