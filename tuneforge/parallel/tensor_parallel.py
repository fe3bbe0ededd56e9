"""Tensor parallelism for the attention and MLP layers, as Megatron splits them: q, k, v, gate
and up column-parallel (each rank computes whole heads, a slice of the MLP), o and down
row-parallel (partial sums, added across the ranks by one all-reduce per branch), through
PyTorch's `parallelize_module` and DTensor. A LoRA adapter follows its base: on a
column-parallel base A is whole and B split by output rows; on a row-parallel one A is split by
input columns and B whole, so that B·A·x summed over the ranks is the unsharded update. The
adapters then run the plain expression in DTensor (the fused kernels take local tensors).

The router, the experts and the shared experts of an MoE layer stay as they are (data-parallel,
or expert-parallel: `expert_parallel.py`); so do the embedding, the norms and the output layer."""

from functools import partial
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import Placement

from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import MLP, Attention
from tuneforge.peft.lora import LoRALinear

COLUMN: dict[str, Placement] = {"base.weight": Shard(0), "base.bias": Shard(0), "lora_B": Shard(0)}
"""Column-parallel placements of a LoRA linear's parameters (the rest, A, whole)."""
ROW: dict[str, Placement] = {"base.weight": Shard(1), "lora_A": Shard(1)}
"""Row-parallel placements (the rest, the bias and B, whole)."""


def _partition_adapter(placements: dict[str, Placement]):
    def partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        if name:  # the adapter's own parameters are placed once, from the adapter
            return
        for path, placement in placements.items():
            owner_path, _, leaf = path.rpartition(".")
            owner = module.get_submodule(owner_path)
            param = getattr(owner, leaf)
            if param is None:
                continue
            sharded = distribute_tensor(param, mesh, [placement])
            owner.register_parameter(leaf, nn.Parameter(sharded, param.requires_grad))

    return partition


class _AdapterAware:
    """A PyTorch parallel style that also takes a `LoRALinear` over a plain linear."""

    placements: dict[str, Placement]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, LoRALinear):
            _refuse_unless_plain(module)
            return super()._apply(module, device_mesh)  # type: ignore[misc]
        _refuse_unless_plain(module.base)
        if module.lora_magnitude is not None:
            raise TuneforgeError(
                "DoRA under parallel.tensor_parallel is not built: set lora.use_dora false, or "
                "parallel.tensor_parallel 1"
            )
        module.fused = False
        style: Any = self
        return distribute_module(
            module,
            device_mesh,
            _partition_adapter(self.placements),
            partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
            partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
        )


def _refuse_unless_plain(linear: nn.Module) -> None:
    if type(linear) is not nn.Linear:
        raise TuneforgeError(
            f"parallel.tensor_parallel splits plain bf16/fp32 linears, not "
            f"{type(linear).__name__} (a low-precision base or trained FP8): set "
            "parallel.tensor_parallel 1 with this precision, or drop the precision setting"
        )


class AdapterColumnParallel(_AdapterAware, ColwiseParallel):
    placements = COLUMN


class AdapterRowParallel(_AdapterAware, RowwiseParallel):
    placements = ROW

    def __init__(self) -> None:
        super().__init__()
        self.desired_input_layouts = (Shard(-1),)


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """Which of a block's linears split how."""
    column, row = AdapterColumnParallel(), AdapterRowParallel()
    plan: dict[str, ParallelStyle] = {}
    if not isinstance(block.attn, Attention):
        raise TuneforgeError(
            "parallel.tensor_parallel is not built for latent attention (DeepSeek-V2): use 1 "
            "and spread the run with FSDP2 and parallel.expert_parallel"
        )
    for name in ("q_proj", "k_proj", "v_proj"):
        plan[f"attn.{name}"] = column
    plan["attn.o_proj"] = row
    for name in ("q_norm", "k_norm"):  # per-head norms: each rank normalises its own heads
        if not isinstance(getattr(block.attn, name), nn.Identity):
            plan[f"attn.{name}"] = SequenceParallel(sequence_dim=1, use_local_output=True)
    if isinstance(block.mlp, MLP):
        plan["mlp.gate_proj"] = column
        plan["mlp.up_proj"] = column
        plan["mlp.down_proj"] = row
    return plan


def apply_tensor_parallel(blocks: nn.ModuleList, mesh: DeviceMesh) -> None:
    """Split every block's attention and dense MLP over `mesh` (the tensor-parallel ranks)."""
    for block in blocks:
        trained = {name: param.requires_grad for name, param in block.named_parameters()}
        parallelize_module(block, mesh, block_plan(block))
        # PyTorch's styles make the parameters they replicate trainable: frozen ones stay frozen
        for name, param in block.named_parameters():
            param.requires_grad_(trained[name])
