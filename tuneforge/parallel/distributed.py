"""One process or many: the process group under `torchrun`, the device of each rank, and the
parallel wrapping (DDP, or FSDP2 `fully_shard` per block) applied from outside the model."""

import contextlib
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from tuneforge.config.sections.parallel import ParallelSection
from tuneforge.errors import TuneforgeError
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


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def configured_dims(parallel: ParallelSection, world: Dist) -> ParallelDims:
    """The configured layout, `single` for `auto` on one process and `fsdp` for it on several
    (the trainer's `choose_dims` picks DDP there where the whole model fits each GPU)."""
    if parallel.strategy == "auto":
        return ParallelDims.of("fsdp" if world.world_size > 1 else "single", world.world_size)
    if parallel.strategy == "single" and world.world_size > 1:
        raise TuneforgeError(
            f"parallel.strategy=single with {world.world_size} processes: use ddp or fsdp (or auto)"
        )
    if parallel.strategy != "single" and not dist.is_initialized() and "RANK" not in os.environ:
        raise TuneforgeError(
            f"parallel.strategy={parallel.strategy} needs processes started by torchrun (one per "
            "GPU): this is one process on its own; start it with torchrun, or use single or auto"
        )
    return ParallelDims.of(parallel.strategy, world.world_size)


def parallelize(
    root: nn.Module,
    blocks: nn.ModuleList,
    dims: ParallelDims,
    parallel: ParallelSection,
    world: Dist,
    fp32_shards: bool = False,
) -> nn.Module:
    """Wrap `root` (which runs `blocks`) for the layout; the returned module is what forward
    and backward run through. FSDP2 shards each block and then the root (embedding, final norm,
    output layer), computing in the model's dtype with reductions in fp32 (or the model's
    dtype); with `fp32_shards` the trained 16-bit parameters are held as fp32 shards, the
    master weights, all-gathered in the model's dtype. Under ZeRO-3 the last block and the
    root keep their parameters gathered after forward: backward needs them at once."""
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
    for index, block in enumerate(blocks):
        last = index == len(blocks) - 1
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard and not last)
    fully_shard(root, mp_policy=policy, reshard_after_forward=False)
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
