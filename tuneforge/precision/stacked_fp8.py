"""The FP8 weights of adapted linears that read the same input (q, k and v) stacked into one
tensor, each linear's weight and scales becoming views of it: their outputs then come from one
FP8 product each way and one quantisation of the input, their low-rank updates from one GEMM over
the block-diagonal B (`Fp8Linear.product_together`), as `peft/stacked_weights.py` does in bf16.
The output gradient of the stacked product is quantised per token across the three, as a fused
projection's is. Per-tensor weight scales cannot be shared by three tensors: only rowwise weights
are stacked."""

import torch
from torch import nn

from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.stacked_weights import GROUPS
from tuneforge.precision.frozen_linear import Fp8Linear, Fp8Stack


def stack_fp8_groups(model: nn.Module) -> int:
    """Stack every group found in `model`; returns how many were stacked."""
    stacked = 0
    for module in model.modules():
        for names in GROUPS:
            linears = [getattr(module, name, None) for name in names]
            if all(isinstance(linear, LoRALinear) for linear in linears):
                bases = [linear.base for linear in linears]  # type: ignore[union-attr]
                if _stackable(bases):
                    _stack(bases)
                    stacked += 1
    return stacked


def _stackable(bases: list) -> bool:
    if not all(isinstance(base, Fp8Linear) for base in bases):
        return False
    first = bases[0]
    with_bias = [base.bias is not None for base in bases]
    return (
        first.recipe.scaling == "rowwise"
        and all(base.recipe == first.recipe for base in bases)
        and all(base.in_features == first.in_features for base in bases)
        and all(base.weight_fp8.device == first.weight_fp8.device for base in bases)
        and len(set(with_bias)) == 1
    )


@torch.no_grad()
def _stack(bases: list[Fp8Linear]) -> None:
    weight = torch.cat([base.weight_fp8 for base in bases])
    scale = torch.cat([base.weight_scale for base in bases], dim=1)
    bias = None
    if bases[0].bias is not None:
        bias = torch.cat([base.bias.detach() for base in bases])  # type: ignore[union-attr]
    start = 0
    for base in bases:
        rows = base.out_features
        base.weight_fp8 = weight[start : start + rows]
        base.weight_scale = scale[:, start : start + rows]
        start += rows
    bases[0].stack = Fp8Stack(weight, scale, bias, [base.out_features for base in bases])
