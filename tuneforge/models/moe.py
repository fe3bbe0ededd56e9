"""Sparse mixture-of-experts MLP (Qwen3-MoE): a softmax router picks top-k experts per token.

Expert weights are stacked 3-D tensors, `gate_proj`/`up_proj` [E, I, D] and `down_proj` [E, D, I].
`grouped` runs all experts in one grouped GEMM per projection (`torch._grouped_mm`) on tokens
sorted by expert; `loop` is the per-expert reference.
"""

import torch
import torch.nn.functional as F
from torch import nn

from tuneforge.models.args import MoEArgs


class ExpertBank(nn.Module):
    def __init__(
        self, num_experts: int, dim: int, ffn_dim: int, implementation: str = "grouped"
    ) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.up_proj = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, ffn_dim))
        self.implementation = implementation

    @property
    def num_experts(self) -> int:
        return self.gate_proj.shape[0]

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
            y = (
                F.silu(h @ self.gate_proj[expert].t()) * (h @ self.up_proj[expert].t())
            ) @ self.down_proj[expert].t()
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out

    def _forward_grouped(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        top_k = expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_of_row = order // top_k
        counts = torch.bincount(flat_ids, minlength=self.num_experts)
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        h = x.index_select(0, token_of_row)
        gate = torch._grouped_mm(h, self.gate_proj.transpose(-2, -1), offs=offsets)
        up = torch._grouped_mm(h, self.up_proj.transpose(-2, -1), offs=offsets)
        y = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token_of_row, y.to(x.dtype))


class MoE(nn.Module):
    def __init__(self, dim: int, args: MoEArgs, implementation: str = "grouped") -> None:
        super().__init__()
        self.top_k = args.top_k
        self.norm_topk_prob = args.norm_topk_prob
        self.router = nn.Linear(dim, args.num_experts, bias=False)
        self.experts = ExpertBank(args.num_experts, dim, args.expert_ffn_dim, implementation)
        self.last_router_logits: torch.Tensor | None = None

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        logits = self.router(x_TD)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_probs, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
        # Kept for the load-balancing loss (recomputation under checkpointing overwrites it with equal values).
        self.last_router_logits = logits
        return self.experts(x_TD, expert_ids, top_probs.to(x_TD.dtype))


def load_balancing_loss(
    router_logits: list[torch.Tensor], num_experts: int, top_k: int
) -> torch.Tensor:
    """Switch-Transformer auxiliary loss as transformers computes it for Qwen3-MoE: expert load
    fractions and mean router probabilities are pooled over all layers, then multiplied."""
    assignments = torch.zeros(num_experts, dtype=torch.float32, device=router_logits[0].device)
    prob_sum = torch.zeros_like(assignments)
    rows = 0
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        selected = torch.topk(probs, top_k, dim=-1).indices
        assignments = (
            assignments + torch.bincount(selected.reshape(-1), minlength=num_experts).float()
        )
        prob_sum = prob_sum + probs.sum(dim=0)
        rows += probs.shape[0]
    return num_experts * torch.sum((assignments / rows) * (prob_sum / rows))
