"""Expert parallelism: each of the `ep` ranks holds `experts / ep` of every MoE layer's experts
(and their LoRA adapters), as DTensors sharded by expert; the router and the shared experts
stay whole. A token's rows go to the ranks holding its top-k experts and come back by two
all-to-alls each way (`all_to_all_single_autograd`: backward sends the gradients back along the
same routes), so only routed tokens cross between ranks, never an expert's weights."""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from tuneforge.errors import TuneforgeError
from tuneforge.models.moe import ExpertBank, MoE


@dataclass(frozen=True)
class Route:
    """How the rows a rank received came, to send their outputs back."""

    order: torch.Tensor
    """Received rows (by source rank, then expert) in the order of their local expert."""
    sent: list[int]
    """Rows sent to each rank."""
    received: list[int]
    """Rows received from each rank."""


def _exchanged(
    rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group
) -> torch.Tensor:
    out = funcol.all_to_all_single_autograd(rows, out_splits, in_splits, group)
    return out.wait() if isinstance(out, funcol.AsyncCollectiveTensor) else out


class AllToAllExchange:
    """The expert bank's `TokenExchange` over the expert-parallel ranks of `mesh`."""

    def __init__(self, mesh: DeviceMesh, num_experts: int) -> None:
        self.group = mesh.get_group()
        self.ranks = mesh.size()
        self.local_experts = num_experts // self.ranks

    def dispatch(
        self, rows: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Route]:
        counts = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long())
        incoming = torch.empty_like(counts)  # [source rank, local expert], flattened
        dist.all_to_all_single(incoming, counts, group=self.group)
        sent = counts.view(self.ranks, -1).sum(1).tolist()
        received = incoming.view(self.ranks, -1).sum(1).tolist()
        arrived = _exchanged(rows, received, sent, self.group)
        experts = torch.arange(self.local_experts, device=rows.device).repeat(self.ranks)
        expert_of_row = experts.repeat_interleave(incoming)
        order = torch.argsort(expert_of_row, stable=True)
        per_expert = incoming.view(self.ranks, -1).sum(0)
        local_offsets = per_expert.cumsum(0).to(torch.int32)
        return arrived[order], local_offsets, Route(order, sent, received)

    def combine(self, rows: torch.Tensor, route: Route) -> torch.Tensor:
        back = torch.empty_like(route.order)
        back[route.order] = torch.arange(route.order.numel(), device=rows.device)
        return _exchanged(rows[back], route.sent, route.received, self.group)


def _shard_by_expert(owner: nn.Module, name: str, mesh: DeviceMesh) -> None:
    param = getattr(owner, name)
    sharded = distribute_tensor(param, mesh, [Shard(0)])
    owner.register_parameter(name, nn.Parameter(sharded, param.requires_grad))


def expert_banks(blocks: nn.ModuleList) -> list[ExpertBank]:
    return [block.mlp.experts for block in blocks if isinstance(block.mlp, MoE)]


def apply_expert_parallel(blocks: nn.ModuleList, mesh: DeviceMesh) -> None:
    """Split every MoE layer's experts and their adapters over `mesh`, the expert-parallel
    ranks, and route tokens to them."""
    for bank in expert_banks(blocks):
        if bank.implementation != "grouped" or len(bank.low_precision):
            raise TuneforgeError(
                "parallel.expert_parallel splits experts held in bf16 or fp32, not in a "
                "low-precision format: drop the experts' FP8 base, or set "
                "parallel.expert_parallel 1"
            )
        for name in ("gate_up_proj", "down_proj"):
            _shard_by_expert(bank, name, mesh)
        for adapter in bank.adapters.values():
            if getattr(adapter, "shared", False):
                raise TuneforgeError(
                    "one LoRA adapter shared by every expert cannot be split by expert: set "
                    "lora.share_expert_adapters false, or parallel.expert_parallel 1"
                )
            for name in ("lora_A", "lora_B"):
                _shard_by_expert(adapter, name, mesh)
        bank.exchange = AllToAllExchange(mesh, bank.num_experts)
