"""LoRA as a module swap: a `LoRALinear` wraps a frozen base linear and adds B·A·x·(alpha/r)."""

import math
from dataclasses import dataclass, field

import torch
from torch import nn

ALL_LINEAR = "all-linear"


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.base = base
        self.rank = rank
        self.scaling = alpha / rank
        factory = {"device": base.weight.device, "dtype": dtype or base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora_parameters()

    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        """A as PEFT initialises it (Kaiming-uniform, a=√5), B zero: the adapter starts as a no-op."""
        bound = 1.0 / math.sqrt(self.base.in_features)
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound, generator=generator)
            self.lora_B.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lora = (self.dropout(x).to(self.lora_A.dtype) @ self.lora_A.t()) @ self.lora_B.t()
        return self.base(x) + (lora * self.scaling).to(x.dtype)

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling
        return (self.base.weight.float() + delta).to(self.base.weight.dtype)


@dataclass
class LoraReport:
    """What `apply_lora` did: modules wrapped per pattern and the trainable share."""

    matched: dict[str, list[str]] = field(default_factory=dict)
    trainable_params: int = 0
    total_params: int = 0

    @property
    def trainable_share(self) -> float:
        return self.trainable_params / max(self.total_params, 1)


class LoraTargetError(ValueError):
    """A target pattern that matches no linear layer."""


def apply_lora(
    model: nn.Module,
    targets: list[str],
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    exclude: tuple[str, ...] = ("lm_head",),
) -> LoraReport:
    """Wrap every linear whose leaf name is in `targets` (or all of them for `all-linear`),
    freeze everything else, and report what matched. Adapters live in `dtype` (default: the
    base weight's), e.g. fp32 adapters on a bf16 base."""
    linears = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] not in exclude
    }
    report = LoraReport(matched={target: [] for target in targets})
    for name in linears:
        leaf = name.rsplit(".", 1)[-1]
        for target in targets:
            if target in (ALL_LINEAR, leaf):
                report.matched[target].append(name)
    unmatched = [target for target, names in report.matched.items() if not names]
    if unmatched:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in linears})
        raise LoraTargetError(
            f"lora.target_modules {unmatched} match no linear layer; the model has: {', '.join(leaves)}"
        )
    for param in model.parameters():
        param.requires_grad_(False)
    wrapped = sorted({name for names in report.matched.values() for name in names})
    for name in wrapped:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lora = LoRALinear(linears[name], rank, alpha, dropout, dtype)
        lora.reset_lora_parameters(generator)
        setattr(parent, leaf, lora)
    report.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    report.total_params = sum(p.numel() for p in model.parameters())
    return report


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {
        name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)
    }


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its base weight and put the plain linear back."""
    for name, module in lora_modules(model).items():
        with torch.no_grad():
            module.base.weight.copy_(module.merged_weight())
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, module.base)
