"""One process or many: the process group under `torchrun`, the device of each rank, and the
parallel wrapping (DDP, or FSDP2 `fully_shard` per block) applied from outside the model."""

import contextlib
import logging
import os
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from tuneforge.config.sections.parallel import ParallelSection
from tuneforge.errors import TuneforgeError
from tuneforge.mesh_rules import MeshSizes, mesh_problems
from tuneforge.parallel.expert_parallel import apply_expert_parallel
from tuneforge.parallel.mesh import Meshes
from tuneforge.parallel.tensor_parallel import apply_tensor_parallel
from tuneforge.parallel_dims import ParallelDims
from tuneforge.plan.policies import reshard_after_forward
from tuneforge.precision.trained_weights import LOW_PRECISION

CPU = torch.device("cpu")

_GATHERED_AFTER_FORWARD: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
"""FSDP2 roots under ZeRO-2: their blocks keep parameters gathered from forward to backward, so
they may as well keep them until the step's last micro-batch (`gradient_sync`)."""


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = CPU

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(nccl_max_channels: int | None = None) -> Dist:
    """Join the process group `torchrun` describes (NCCL on GPUs, gloo on CPU, with at most
    `nccl_max_channels` channels per collective if given); one process without it."""
    if nccl_max_channels is not None:
        os.environ["NCCL_MAX_NCHANNELS"] = str(nccl_max_channels)  # read when NCCL starts
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Dist(rank, world_size, local_rank, device)


def exit_rank(code: int) -> None:
    """End a rank whose work is saved and whose process group is destroyed. DTensor's caches
    keep the groups alive until the interpreter's teardown, where gloo can abort the process
    and turn a finished run into a failed job; nothing is left to do but flush."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def configured_dims(parallel: ParallelSection, world: Dist) -> ParallelDims:
    """The configured layout, `single` for `auto` on one process and `fsdp` for it on several
    (the trainer's `choose_dims` picks DDP there where the whole model fits each GPU and no
    mesh dimension is asked for)."""
    sizes = MeshSizes(
        world.world_size,
        parallel.tensor_parallel,
        parallel.expert_parallel,
        parallel.data_parallel_replicate,
    )
    problems = mesh_problems(sizes)
    if problems:
        raise TuneforgeError("; ".join(problems))
    mesh = (sizes.tensor, sizes.expert, sizes.replicate)
    if parallel.strategy == "auto":
        strategy = "fsdp" if world.world_size > 1 else "single"
        return ParallelDims.of(strategy, world.world_size, *mesh)
    if parallel.strategy == "single" and world.world_size > 1:
        raise TuneforgeError(
            f"parallel.strategy=single with {world.world_size} processes: use ddp or fsdp (or auto)"
        )
    if parallel.strategy != "single" and not dist.is_initialized() and "RANK" not in os.environ:
        raise TuneforgeError(
            f"parallel.strategy={parallel.strategy} needs processes started by torchrun (one per "
            "GPU): this is one process on its own; start it with torchrun, or use single or auto"
        )
    return ParallelDims.of(parallel.strategy, world.world_size, *mesh)


def parallelize(
    root: nn.Module,
    blocks: nn.ModuleList,
    dims: ParallelDims,
    parallel: ParallelSection,
    world: Dist,
    fp32_shards: bool = False,
    meshes: Meshes | None = None,
) -> nn.Module:
    """Wrap `root` (which runs `blocks`) for the layout; the returned module is what forward
    and backward run through. FSDP2 shards each block and then the root (embedding, final norm,
    output layer), computing in the model's dtype with reductions in fp32 (or the model's
    dtype); with `fp32_shards` the trained 16-bit parameters are held as fp32 shards, the
    master weights, all-gathered in the model's dtype. Under ZeRO-3 the last block and the
    root keep their parameters gathered after forward: backward needs them at once.

    On a device mesh (`meshes`, for tensor, expert or replica dimensions) the blocks' layers
    are split over the tensor- and expert-parallel ranks first; FSDP2 then shards the dense
    parameters over the data-parallel ranks (HSDP: within each replica group) and each rank's
    experts over the ranks that hold the same ones."""
    if dims.data_parallel == "none":
        return root
    if dims.replicated:
        ids = [world.device.index] if world.device.type == "cuda" else None
        # gradients as views into the all-reduce buckets: no copy in or out of them; buffers
        # (rotary tables, quantised frozen weights) are made alike on every rank, not broadcast
        return nn.parallel.DistributedDataParallel(
            root, device_ids=ids, gradient_as_bucket_view=True, broadcast_buffers=False
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if meshes is not None and dims.tensor > 1:
        apply_tensor_parallel(blocks, meshes.tensor)
    if meshes is not None and dims.expert > 1:
        apply_expert_parallel(blocks, meshes.expert)
    dtype = next(root.parameters()).dtype
    if fp32_shards:
        for param in root.parameters():
            if param.requires_grad and param.dtype in LOW_PRECISION:
                # swapped whole, not through `.data`: a tensor subclass (torchao's FP8 weight)
                # would keep its inner tensor in 16 bits, and FSDP2 shards that one
                fp32 = nn.Parameter(param.detach().float(), requires_grad=True)
                torch.utils.swap_tensors(param, fp32)
    reduce_dtype = torch.float32 if parallel.reduce_dtype == "float32" else dtype
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
    reshard = reshard_after_forward(parallel)
    dense = meshes.dense if meshes is not None else None
    for index, block in enumerate(blocks):
        last = index == len(blocks) - 1
        experts = getattr(block.mlp, "experts", None)
        if meshes is not None and dims.expert > 1 and experts is not None:
            fully_shard(
                experts,
                mesh=meshes.expert_data,
                mp_policy=policy,
                reshard_after_forward=reshard and not last,
            )
            # a rank's expert gradients hold every expert-parallel rank's tokens: averaged over
            # all data-parallel ranks, as the dense ones, not only over those holding them
            experts.set_gradient_divide_factor(float(dims.data_parallel_size))
            if dims.expert_shards > 1:
                # a sum, then the division (gloo has no pre-multiplied sum); not with one shard,
                # where FSDP2 divides the gradient as it copies it, and would again after
                experts.set_force_sum_reduction_for_comms(True)
        fully_shard(block, mesh=dense, mp_policy=policy, reshard_after_forward=reshard and not last)
    fully_shard(root, mesh=dense, mp_policy=policy, reshard_after_forward=False)
    if not reshard:
        _GATHERED_AFTER_FORWARD.add(root)
    return root


def shard_frozen(blocks: nn.ModuleList, dtype: torch.dtype) -> None:
    """A frozen model held beside the trained one (a distillation teacher, a preference run's
    frozen copy) sharded with FSDP2: each rank keeps 1/N of each block's weights, all-gathered
    block by block during its forward and freed after. Its embedding, final norm and output
    layer stay whole on every rank (small beside the blocks; the objective reads the output
    layer's weight directly). Parameters compute in `dtype`, the model's, as the trained
    model's do under FSDP2."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype)
    for block in blocks:
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)


@contextlib.contextmanager
def gradient_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients only on the last micro-batch of a step (DDP and FSDP2). Under ZeRO-2,
    FSDP2 also keeps the parameters gathered until then: its peak already holds them all
    during backward, and the next micro-batch's forward then gathers nothing."""
    if isinstance(module, nn.parallel.DistributedDataParallel) and not enabled:
        with module.no_sync():
            yield
        return
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(enabled)
        if module in _GATHERED_AFTER_FORWARD:
            module.set_reshard_after_backward(enabled)
    yield


def unwrap(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
