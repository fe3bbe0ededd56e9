"""DoRA (Liu et al. 2024, "Weight-Decomposed Low-Rank Adaptation") on a LoRA linear: the
adapted weight is m · (W + s·B·A) / ‖W + s·B·A‖, its rows' directions from the low-rank update
and their norms from a trained magnitude m [out], which starts at ‖W‖ so that the adapter
starts as a no-op. As the paper's section 4.3 and PEFT do, the norm is treated as a constant in
backward (no gradient through it), so the output is

    base(x) + (m/‖·‖ − 1) · x·Wᵀ + (m/‖·‖) · s · (x·Aᵀ)·Bᵀ,

x·Wᵀ without the bias (on the adapter's dropped-out input where there is dropout, as PEFT)."""

import torch
import torch.nn.functional as F

from tuneforge.peft.low_rank_adapter import LowRankAdapter


def weight_norm(weight: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """‖W + ΔW‖ of each output row [out], without gradient."""
    with torch.no_grad():
        return torch.linalg.vector_norm(weight + update, dim=1)


def low_rank_weight(adapter: LowRankAdapter, dtype: torch.dtype) -> torch.Tensor:
    return adapter.scaling * (adapter.lora_B.to(dtype) @ adapter.lora_A.to(dtype))


def base_weight(adapter: LowRankAdapter) -> torch.Tensor:
    weight = adapter.base.weight
    assert isinstance(weight, torch.Tensor)  # DoRA's base is a plain linear (config rules)
    return weight


@torch.no_grad()
def initial_magnitude(adapter: LowRankAdapter) -> torch.Tensor:
    weight = base_weight(adapter).float()
    return weight_norm(weight, low_rank_weight(adapter, torch.float32))


def dora_forward(adapter: LowRankAdapter, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The adapted linear's output for `x`, the adapter computing in `dtype`."""
    base, weight = adapter.base, base_weight(adapter)
    magnitude = adapter.lora_magnitude
    assert magnitude is not None
    norm = weight_norm(weight.to(dtype), low_rank_weight(adapter, dtype))
    scale = (magnitude.to(dtype) / norm).view(1, -1)
    dropout = adapter.dropout
    h = dropout.pre(x).to(dtype)
    update = (h @ adapter.lora_A.to(dtype).t()) @ adapter.lora_B.to(dtype).t()
    out = base(x)
    if dropout.p == 0 or dropout.position == "post" or not adapter.training:
        # the adapter reads x itself: x·Wᵀ is the base's output, no second product
        direction = (out if base.bias is None else out - base.bias).to(dtype)
    else:
        direction = F.linear(h, weight.to(dtype))  # x·Wᵀ without the bias, on the dropped input
    out = out + ((scale - 1) * direction).to(x.dtype)
    return out + dropout.post(scale * update * adapter.scaling).to(x.dtype)


@torch.no_grad()
def dora_merged_weight(adapter: LowRankAdapter) -> torch.Tensor:
    """m / ‖W + ΔW‖ · (W + ΔW), in fp32."""
    weight = base_weight(adapter).float()
    update = low_rank_weight(adapter, torch.float32)
    magnitude = adapter.lora_magnitude
    assert magnitude is not None
    return (magnitude.float() / weight_norm(weight, update)).view(-1, 1) * (weight + update)
