"""LoRA on a stacked expert projection W [E, out, in]: expert e's output gains
scale · B[e]·A[e]·x, with A [E, r, in] and B [E, out, r] run through the same grouped GEMM as
the experts (or one adapter shared by every expert). Attached to an `ExpertBank` under
`adapters[projection]`, so the bank keeps its routing and the adapters stay separate weights."""

import torch
from torch import nn

from tuneforge.models.moe import grouped_linear, local_part
from tuneforge.peft.lora import AdapterDropout, adapter_compute_dtype, init_lora_A, lora_scaling


class ExpertLoRA(nn.Module):
    def __init__(
        self,
        num_experts: int,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float,
        *,
        shared: bool = False,
        dropout: float = 0.0,
        dropout_position: str = "pre",
        use_rslora: bool = False,
        init: str = "kaiming",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        compute_dtype: str = "model",
    ) -> None:
        super().__init__()
        self.compute_dtype = compute_dtype
        self.enabled = True
        """False: the bank runs without this update (`adapters_disabled`)."""
        self.num_experts = num_experts
        self.rank = rank
        self.alpha = alpha
        self.use_rslora = use_rslora
        self.init = init
        self.scaling = lora_scaling(rank, alpha, use_rslora)
        count = 1 if shared else num_experts
        self.lora_A = nn.Parameter(
            torch.empty(count, rank, in_features, device=device, dtype=dtype)
        )
        self.lora_B = nn.Parameter(
            torch.zeros(count, out_features, rank, device=device, dtype=dtype)
        )
        self.dropout = AdapterDropout(dropout, dropout_position)
        self.reset_lora_parameters()

    @property
    def shared(self) -> bool:
        return self.lora_A.shape[0] == 1 and self.num_experts > 1

    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        init_lora_A(self.lora_A, self.init, self.rank, generator)
        with torch.no_grad():
            self.lora_B.zero_()

    def grouped(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The update for rows of `x` sorted by expert (`offsets`: cumulative rows per expert)."""
        dtype = adapter_compute_dtype(self.compute_dtype, x, self.lora_A)
        h = self.dropout.pre(x).to(dtype)
        lora_A, lora_B = local_part(self.lora_A).to(dtype), local_part(self.lora_B).to(dtype)
        if self.shared:
            update = (h @ lora_A[0].t()) @ lora_B[0].t()
        else:
            update = grouped_linear(grouped_linear(h, lora_A, offsets), lora_B, offsets)
        return self.dropout.post(update * self.scaling).to(x.dtype)

    def single(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """The update for rows of `x` that all go to `expert`."""
        index = 0 if self.shared else expert
        dtype = adapter_compute_dtype(self.compute_dtype, x, self.lora_A)
        h = self.dropout.pre(x).to(dtype)
        update = (h @ self.lora_A[index].to(dtype).t()) @ self.lora_B[index].to(dtype).t()
        return self.dropout.post(update * self.scaling).to(x.dtype)

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """scale · B[e]·A[e] for every expert: [E, out, in]."""
        delta = torch.bmm(self.lora_B.float(), self.lora_A.float()) * self.scaling
        return delta.expand(self.num_experts, -1, -1) if self.shared else delta
