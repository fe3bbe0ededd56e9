"""The model's way from built to trained, one pipeline for the trainer and the benchmark alike:
adapters → precision → the objective (and the frozen models it holds) → host offload and block
wrappers → data parallelism → stacked frozen weights → optimizer."""

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed import ProcessGroup

from tuneforge.config.schema import RunConfig
from tuneforge.errors import TuneforgeError
from tuneforge.execution.block_wrappers import (
    BlockWrapping,
    refuse_unsupported_offload,
    wrap_blocks,
)
from tuneforge.execution.host_embedding import embedding_to_host
from tuneforge.hardware.gpus import release_cached_memory
from tuneforge.mesh_rules import MeshSizes, mesh_problems
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import Dist, parallelize
from tuneforge.parallel.mesh import Meshes, build_meshes
from tuneforge.parallel_dims import ParallelDims
from tuneforge.peft.adapter_io import continue_adapter
from tuneforge.peft.apply import LoraReport, apply_lora
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.converters import ArrivedFourBit
from tuneforge.precision.report import PrecisionReport
from tuneforge.precision.trained_weights import TrainedWeights
from tuneforge.train.objectives.component import ObjectiveSetup
from tuneforge.train.objectives.registry import build_objective
from tuneforge.train.optim import build_optimizer

log = logging.getLogger(__name__)


@dataclass
class PreparedModel:
    objective: nn.Module
    """What forward and backward run through: the objective, wrapped for the parallel layout."""
    optimizer: torch.optim.Optimizer
    lora: LoraReport
    precision: PrecisionReport
    weights: TrainedWeights
    meshes: Meshes | None = None
    """The device mesh's dimensions, where the layout has tensor, expert or replica ones."""

    @property
    def data_group(self) -> ProcessGroup | None:
        """The ranks that read different data, where not every rank does (None: all)."""
        return self.meshes.data.get_group() if self.meshes is not None else None


def prepare_model(
    config: RunConfig,
    model: Decoder,
    world: Dist,
    dims: ParallelDims,
    setup: ObjectiveSetup | None = None,
    arrived: ArrivedFourBit | None = None,
    wrapping: BlockWrapping | None = None,
) -> PreparedModel:
    """Everything between building `model` and its first step, as `config` says. `setup`
    carries what the objective's frozen models need beyond the model (the data for a frozen
    pass, the state of a resume); `arrived`: the 4-bit projections `build_model` quantised on
    their way to the device; `wrapping` replaces the block wrappers `train` asks for."""
    train, device = config.train, world.device
    meshes = None
    if dims.on_mesh:
        sizes = MeshSizes(dims.world_size, dims.tensor, dims.expert, dims.replicate)
        problems = mesh_problems(sizes, model.args.split_sizes())
        if problems:
            raise TuneforgeError("; ".join(problems))
        meshes = build_meshes(dims, device)
    generator = torch.Generator(device=device).manual_seed(train.seed + 1)
    lora = apply_lora(model, config.lora, generator, torch.float32)
    lora.log(log)
    if config.lora.enabled and config.lora.init_adapter is not None:  # a resume loads its own
        continue_adapter(model, config.lora.init_adapter, config.lora)
    precision = apply_precision(model, config.precision, dims.sharded, config.model, arrived)
    precision.log(log)
    setup = setup or ObjectiveSetup(config, model, device)
    setup.dims = dims
    objective = build_objective(setup)
    refuse_unsupported_offload(train, world.world_size, model.args)
    if train.offload_embedding:
        embedding_to_host(model, world.world_size)
    wrap_blocks(model, wrapping or BlockWrapping.of(train))
    weights = TrainedWeights.of(config.precision.master_weights, config.model.dtype)
    weights.log(model, dims.sharded)
    fp32_shards = weights.fp32_shards(dims.sharded)
    wrapped = parallelize(
        objective, model.layers, dims, config.parallel, world, fp32_shards, meshes
    )
    stack_frozen_weights(model)  # where unsharded: q, k and v as one GEMM
    release_cached_memory(device)
    optimizer = build_optimizer(model, train, device, weights)
    return PreparedModel(wrapped, optimizer, lora, precision, weights, meshes)
