"""Frozen weights of adapters widened to [W | B] (`peft/wide_lora.py`): each group of adapters
reading one input gets tails as wide as their ranks together, the base parameters become views
of the wide tensors' first columns (names, state dicts and saved adapters unchanged), and each
block writes its adapters' B into the tails before it runs (the optimizer changes B between
steps; a recomputed block writes the same values again).

Widened only where it holds: plain (unsharded) frozen weights, no dropout. Call after
`stack_frozen_weights` (a stacked q, k and v become one wide weight) and after the blocks'
other wrappers."""

from collections.abc import Callable

import torch
from torch import nn

from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.stacked_weights import GROUPS as STACKED_GROUPS
from tuneforge.peft.stacked_weights import plain_frozen

SHARED_INPUT_GROUPS = (*STACKED_GROUPS, ("gate_proj", "up_proj"))
"""Linears of one module that read the same input; any other adapter is a group of its own."""


def widen_frozen_weights(blocks: nn.ModuleList) -> int:
    """Widen every adapter of `blocks` that can be, and make each block rewrite its tails
    before it runs; returns how many adapters were widened."""
    widened = 0
    for block in blocks:
        linears = [linear for group in _groups(block) for linear in _widen(group)]
        if linears:
            block.forward = _writing_tails(block.forward, linears)
            widened += len(linears)
    return widened


def _groups(block: nn.Module) -> list[list[LoRALinear]]:
    groups, grouped = [], set()
    for module in block.modules():
        for names in SHARED_INPUT_GROUPS:
            group = [getattr(module, name, None) for name in names]
            if all(_widenable(linear) for linear in group):
                groups.append(group)
                grouped.update(id(linear) for linear in group)
    singles = [m for m in block.modules() if _widenable(m) and id(m) not in grouped]
    return groups + [[linear] for linear in singles]


def _widenable(linear) -> bool:
    if not isinstance(linear, LoRALinear) or linear.dropout.p != 0:
        return False
    frozen = [linear.base.weight] + ([linear.base.bias] if linear.base.bias is not None else [])
    return linear.wide_target is None and all(plain_frozen(t) for t in frozen)


@torch.no_grad()
def _widen(group: list[LoRALinear]) -> list[LoRALinear]:
    """Each weight of the group (or its stacked weight) copied into [W | 0]; the base
    parameters become views of it."""
    rank_total = sum(linear.rank for linear in group)
    stacked = group[0].stacked_weight if len(group) > 1 else None
    if stacked is not None:
        weights, biases = [stacked], [group[0].stacked_bias]
    else:
        weights = [linear.base.weight for linear in group]
        biases = [linear.base.bias for linear in group]
    wides = [torch.cat([w, w.new_zeros(w.shape[0], rank_total)], dim=1) for w in weights]
    row, col = 0, 0
    for index, linear in enumerate(group):
        wide = wides[0] if stacked is not None else wides[index]
        row = row if stacked is not None else 0
        rows = linear.base.out_features
        linear.base.weight.data = wide[row : row + rows, : linear.base.in_features]
        linear.wide_layout = (row, rows, col, linear.rank)
        linear.wide_target = wide
        if row == 0:
            linear.wide_weight = wide
            linear.wide_bias = biases[0] if stacked is not None else biases[index]
        row, col = row + rows, col + linear.rank
    group[0].stacked_weight = group[0].stacked_bias = None  # the wide tensor replaces it
    write_tails(group)
    return group


@torch.no_grad()
def write_tails(linears: list[LoRALinear]) -> None:
    """Each widened adapter's B, in the weights' dtype, written into its tail columns (one
    multi-tensor copy)."""
    live = [linear for linear in linears if linear.wide_target is not None]
    if live:
        tails = [_tail(linear) for linear in live]
        torch._foreach_copy_(tails, [linear.lora_B for linear in live])


def _tail(linear: LoRALinear) -> torch.Tensor:
    row, rows, col, rank = linear.wide_layout
    start = linear.base.in_features + col
    return linear.wide_target[row : row + rows, start : start + rank]


def _writing_tails(forward: Callable, linears: list[LoRALinear]) -> Callable:
    def forward_with_current_tails(*args, **kwargs):
        write_tails(linears)
        return forward(*args, **kwargs)

    return forward_with_current_tails
