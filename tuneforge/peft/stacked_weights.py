"""The frozen base weights of adapters that read the same input (q, k and v) moved into one
stacked tensor, their parameters becoming views of it. `StackedSharedInputLoRA` then makes the
three outputs with one GEMM each way (x·[W_q; W_k; W_v]ᵀ, and g·[W_q; W_k; W_v] for the input
gradient) instead of three, and their low-rank updates with one. Parameter names, state dicts,
checkpoints and saved adapters are unchanged; merging writes through the views.

Stacked only where it holds: plain (unsharded) frozen weights of one dtype and device, each
wrapped by a `LoRALinear`. Gate and up are left apart: one wider GEMM is slower there
(bench/RESULTS.md, the fifth pass's kernel probe)."""

from typing import cast

import torch
from torch import nn

from tuneforge.peft.lora import LoRALinear

GROUPS = (("q_proj", "k_proj", "v_proj"),)


def stack_frozen_weights(model: nn.Module) -> int:
    """Stack every group found in `model`; returns how many were stacked."""
    stacked = 0
    for module in model.modules():
        for names in GROUPS:
            linears = [getattr(module, name, None) for name in names]
            adapters = [linear for linear in linears if isinstance(linear, LoRALinear)]
            if len(adapters) == len(linears) and _stackable(adapters):
                _stack(adapters)
                stacked += 1
    return stacked


def _stackable(linears: list) -> bool:
    if not all(
        isinstance(linear, LoRALinear) and isinstance(linear.base, nn.Linear) for linear in linears
    ):
        return False
    weights = [linear.base.weight for linear in linears]
    biases = [linear.base.bias for linear in linears]
    first = weights[0]
    present = [b for b in biases if b is not None]
    return (
        all(plain_frozen(w) for w in weights + present)
        and all(w.dtype == first.dtype and w.device == first.device for w in weights)
        and all(w.shape[1] == first.shape[1] for w in weights)
        and len(present) in (0, len(biases))
    )


def plain_frozen(param: torch.Tensor) -> bool:
    """Not trained, and not sharded (an FSDP2 DTensor is no plain tensor)."""
    return type(param.data) is torch.Tensor and not param.requires_grad


@torch.no_grad()
def _stack(linears: list[LoRALinear]) -> None:
    bases = [cast(nn.Linear, linear.base) for linear in linears]
    weight = torch.cat([base.weight for base in bases])
    bias = None if bases[0].bias is None else torch.cat([base.bias for base in bases])
    start = 0
    for base in bases:
        rows = base.weight.shape[0]
        base.weight.data = weight[start : start + rows]
        if bias is not None:
            base.bias.data = bias[start : start + rows]
        start += rows
    linears[0].stacked_weight, linears[0].stacked_bias = weight, bias
