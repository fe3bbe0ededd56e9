"""Sparse mixture-of-experts MLP (Qwen3-MoE): a softmax router picks top-k experts per token.

Expert weights are stacked 3-D tensors: `gate_up_proj` [E, 2I, D] (each expert's gate rows, then
its up rows, as transformers holds them: one GEMM makes both) and `down_proj` [E, D, I].
`grouped` runs all experts in one grouped GEMM per projection (`torch._grouped_mm`) on tokens
sorted by expert; `loop` is the per-expert reference.
"""

from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from tuneforge.models.args import MoEArgs
from tuneforge.models.gather_sum import gather_sum


def grouped_linear(
    x: torch.Tensor, weight_EOI: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Rows of `x` sorted by expert, each multiplied by its expert's weight [out, in]: one grouped
    GEMM when the shapes meet its 16-byte alignment (and, but for eager CPU, the dtype is bf16,
    which the compiler's shape check of the grouped GEMM insists on), else one matmul per
    expert."""
    size = x.element_size()
    eager_cpu = x.device.type == "cpu" and not torch.compiler.is_compiling()
    takes = x.dtype == torch.bfloat16 or eager_cpu
    if takes and (x.shape[1] * size) % 16 == 0 and (weight_EOI.shape[1] * size) % 16 == 0:
        return torch._grouped_mm(x, weight_EOI.transpose(-2, -1), offs=offsets)
    starts = [0, *offsets.tolist()]
    return torch.cat(
        [x[starts[e] : starts[e + 1]] @ weight_EOI[e].t() for e in range(weight_EOI.shape[0])]
    )


def expert_offsets(sorted_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Cumulative rows per expert (int32, as grouped GEMMs take them) from the sorted expert ids.
    A search, not `bincount`: bincount's output size depends on the data, which makes it wait
    for the device and splits a compiled graph."""
    experts = torch.arange(num_experts, device=sorted_ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)


def _to_rows(x: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """Each token's row repeated for its k experts, in expert order."""
    return x.index_select(0, token_of_row)


class _Dispatch(torch.autograd.Function):
    """`_to_rows`; backward sums each token's k rows back (`gather_sum`, no atomic adds)."""

    @staticmethod
    def forward(ctx, x, token_of_row, inverse, top_k: int):
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return _to_rows(x, token_of_row)

    @staticmethod
    def backward(ctx, grad_rows):
        (inverse,) = ctx.saved_tensors
        return gather_sum(grad_rows, inverse, None, ctx.top_k), None, None, None


class _Combine(torch.autograd.Function):
    """Each token's k expert rows weighted by its router weights [T, k] and summed
    (`gather_sum`); backward sends the gradient back to the rows and makes the weights'."""

    @staticmethod
    def forward(ctx, rows, weights, token_of_row, inverse, order):
        ctx.save_for_backward(rows, weights, token_of_row, inverse, order)
        return gather_sum(rows, inverse, weights, weights.shape[1])

    @staticmethod
    def backward(ctx, grad):
        rows, weights, token_of_row, inverse, order = ctx.saved_tensors
        grad_of_row = _to_rows(grad, token_of_row)
        weight_of_row = weights.reshape(-1)[order, None].to(rows.dtype)
        grad_weights = None
        if ctx.needs_input_grad[1]:
            per_row = (grad_of_row.float() * rows.float()).sum(-1)
            grad_weights = per_row[inverse].view_as(weights).to(weights.dtype)
        return grad_of_row * weight_of_row, grad_weights, None, None, None


def local_part(weight: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a stacked expert weight: its own shard where the experts are split
    between ranks (a DTensor), else the whole tensor."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


class TokenExchange(Protocol):
    """Where the experts are split between ranks (expert parallelism, set from outside the
    model): rows sorted by global expert go to the ranks holding their experts and come back."""

    def dispatch(
        self, rows: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(the rows this rank's experts receive, sorted by local expert; their cumulative
        counts per local expert; the route back)."""
        ...

    def combine(self, rows: torch.Tensor, route: Any) -> torch.Tensor:
        """The received rows' outputs sent back, in the order `dispatch` took them."""
        ...


class BankProduct(Protocol):
    """What an expert bank asks of a module on one of its projections: an adapter's update of
    the projection's output (LoRA's `ExpertLoRA`; skipped while not `enabled`), or the base
    product itself in a low-precision format (`tuneforge.precision`)."""

    enabled: bool

    def single(self, x: torch.Tensor, expert: int) -> torch.Tensor: ...

    def grouped(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor: ...


class ExpertBank(nn.Module):
    def __init__(
        self, num_experts: int, dim: int, ffn_dim: int, implementation: str = "grouped"
    ) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * ffn_dim, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, ffn_dim))
        self.implementation = implementation
        self.num_experts = num_experts
        self.adapters = nn.ModuleDict()
        """Low-rank updates (LoRA) by projection: `gate_up_proj` (gate and up stacked, as
        transformers and PEFT hold them) and `down_proj`; each has `grouped(x, offsets)` and
        `single(x, expert)` returning the update of the projection's output."""
        self.low_precision = nn.ModuleDict()
        """Base products by projection that replace the weights' own (a frozen bank in FP8);
        the weight parameter may then be dropped."""
        self.exchange: TokenExchange | None = None
        """Set where the experts are split between ranks: each holds `num_experts / ranks`."""

    def forward(
        self, x_TD: torch.Tensor, expert_ids_TK: torch.Tensor, weights_TK: torch.Tensor
    ) -> torch.Tensor:
        if self.implementation == "loop":
            return self._forward_loop(x_TD, expert_ids_TK, weights_TK)
        return self._forward_grouped(x_TD, expert_ids_TK, weights_TK)

    def _forward_loop(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in range(self.num_experts):
            token, slot = torch.where(expert_ids == expert)
            if token.numel() == 0:
                continue
            h = x[token]
            gate_up = self._base_single("gate_up_proj", h, expert)
            if self._adapted("gate_up_proj"):
                gate_up = gate_up + self._adapter("gate_up_proj").single(h, expert)
            gate, up = gate_up.chunk(2, -1)
            act = F.silu(gate) * up
            y = self._base_single("down_proj", act, expert)
            if self._adapted("down_proj"):
                y = y + self._adapter("down_proj").single(act, expert)
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out

    def _adapted(self, projection: str) -> bool:
        return projection in self.adapters and self._adapter(projection).enabled

    def _adapter(self, projection: str) -> BankProduct:
        return cast(BankProduct, self.adapters[projection])

    def _base_single(self, projection: str, rows: torch.Tensor, expert: int) -> torch.Tensor:
        if projection in self.low_precision:
            return cast(BankProduct, self.low_precision[projection]).single(rows, expert)
        return rows @ local_part(getattr(self, projection))[expert].t()

    def _base_grouped(
        self, projection: str, rows: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        if projection in self.low_precision:
            return cast(BankProduct, self.low_precision[projection]).grouped(rows, offsets)
        return grouped_linear(rows, local_part(getattr(self, projection)), offsets)

    def _forward_grouped(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        top_k = expert_ids.shape[1]
        sorted_ids, order = torch.sort(expert_ids.reshape(-1), stable=True)
        token_of_row = order // top_k
        inverse = torch.empty_like(order).scatter_(
            0, order, torch.arange(order.numel(), device=order.device)
        )
        offsets = expert_offsets(sorted_ids, self.num_experts)
        h = _Dispatch.apply(x, token_of_row, inverse, top_k)
        if self.exchange is None:
            y = self._experts_grouped(h, offsets)
        else:
            received, local_offsets, route = self.exchange.dispatch(h, offsets)
            y = self.exchange.combine(self._experts_grouped(received, local_offsets), route)
        return _Combine.apply(y.to(x.dtype), weights, token_of_row, inverse, order)

    def _experts_grouped(self, h: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Each row of `h` (sorted by expert, `offsets` cumulative rows per expert held here)
        through its expert's SwiGLU."""
        gate_up = self._base_grouped("gate_up_proj", h, offsets)
        if self._adapted("gate_up_proj"):
            gate_up = gate_up + self._adapter("gate_up_proj").grouped(h, offsets)
        gate, up = gate_up.chunk(2, -1)
        act = F.silu(gate) * up
        y = self._base_grouped("down_proj", act, offsets)
        if self._adapted("down_proj"):
            y = y + self._adapter("down_proj").grouped(act, offsets)
        return y


class MoE(nn.Module):
    def __init__(
        self,
        dim: int,
        args: MoEArgs,
        implementation: str = "grouped",
        shared_experts: nn.Module | None = None,
    ) -> None:
        """`shared_experts`: an MLP every token goes through beside its routed experts."""
        super().__init__()
        self.top_k = args.top_k
        self.norm_topk_prob = args.norm_topk_prob
        self.routed_scaling = args.routed_scaling
        self.shared_experts = shared_experts
        self.router = nn.Linear(dim, args.num_experts, bias=False)
        self.experts = ExpertBank(args.num_experts, dim, args.expert_ffn_dim, implementation)
        self.last_router_logits: torch.Tensor | None = None
        self.record_router_logits = True
        """Off while activation checkpointing recomputes the block in backward: logits kept
        then would hold the recomputed block's activations until the next forward."""

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        logits = self.router(x_TD)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_probs, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
        if self.routed_scaling != 1.0:
            top_probs = top_probs * self.routed_scaling
        if self.record_router_logits:  # for the load-balancing loss
            self.last_router_logits = logits
        routed = self.experts(x_TD, expert_ids, top_probs.to(x_TD.dtype))
        return routed if self.shared_experts is None else routed + self.shared_experts(x_TD)


def load_balancing_loss(
    router_logits: list[torch.Tensor],
    num_experts: int,
    top_k: int,
    real_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Switch-Transformer auxiliary loss as transformers computes it for Qwen3-MoE: expert load
    fractions and mean router probabilities are pooled over all layers, then multiplied.
    `real_tokens` (a 0-d tensor): only the first that many rows count, the rest being padding
    (a batch brought to a fixed shape), without the host reading the count."""
    device = router_logits[0].device
    assignments = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_sum = torch.zeros_like(assignments)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        selected = torch.topk(probs, top_k, dim=-1).indices
        counted = (
            torch.ones(probs.shape[0], dtype=torch.float32, device=device)
            if real_tokens is None
            else (torch.arange(probs.shape[0], device=device) < real_tokens).float()
        )
        ones = counted[:, None].expand(-1, top_k).reshape(-1)
        assignments = assignments.scatter_add(0, selected.reshape(-1), ones)  # no host wait
        prob_sum = prob_sum + (probs * counted[:, None]).sum(dim=0)
        rows = rows + counted.sum()
    return num_experts * torch.sum((assignments / rows) * (prob_sum / rows))
