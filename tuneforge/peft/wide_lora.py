"""LoRA linears whose frozen weight is stored wide, [W | B] (out × (in + R)), so that the base
GEMM adds the low-rank update itself: y = [x | s·u]·[W | B]ᵀ with u = x·Aᵀ, and in backward
g·[W | B] gives the input gradient and g·B in one GEMM. No pass over the full-width output adds
the update, and none over the output gradient makes g·B.

Linears reading the same input (q, k and v; gate and up) share one wide input
[x | s₁·u₁ | … | sₙ·uₙ]; each wide weight holds its B in its own columns of the tail and zeros
in the others. `peft/wide_weights.py` widens the weights and keeps the tails equal to B.
The tests' reference is each linear's plain LoRA expression."""

import torch

from tuneforge.peft.fused_lora import as_rows, shaped_like
from tuneforge.peft.shared_input_lora import matmul_sum


class WideLoRA(torch.autograd.Function):
    """`wide_rows` [N, in + R] = [x | s·u] and whether x needs a gradient; the group's m wide
    weights [outⱼ, in + R], their biases (or None), and the n adapters' B. `layout[i]` = (first
    row in its wide weight, rows, first tail column, rank) of adapter i, whose weight is the
    latest one starting at row 0. Returns the m outputs."""

    @staticmethod
    def forward(ctx, wide_rows, input_needs_grad: bool, rank_total: int, layout: tuple, *tensors):
        count = (len(tensors) - len(layout)) // 2
        weights, biases = tensors[:count], tensors[count : 2 * count]
        outputs = tuple(
            wide_rows @ weight.t() if bias is None else torch.addmm(bias, wide_rows, weight.t())
            for weight, bias in zip(weights, biases, strict=True)
        )
        ctx.save_for_backward(
            wide_rows[:, wide_rows.shape[1] - rank_total :].contiguous(), *weights
        )
        ctx.input_needs_grad, ctx.layout = input_needs_grad, layout
        ctx.adapter_dtypes = [b.dtype for b in tensors[2 * count :]]
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        tail, *weights = ctx.saved_tensors
        if ctx.input_needs_grad:
            d_wide = matmul_sum(list(grads), weights)
        else:  # x from a frozen embedding: only the tail's gradient, g·B, is made
            rank_total = tail.shape[1]
            d_wide = tail.new_zeros(tail.shape[0], weights[0].shape[1])
            d_wide[:, -rank_total:] = matmul_sum(list(grads), [w[:, -rank_total:] for w in weights])
        dBs, j = [], -1
        for (row, rows, col, rank), dtype in zip(ctx.layout, ctx.adapter_dtypes, strict=True):
            j += row == 0
            g = grads[j][:, row : row + rows]
            dBs.append((g.t() @ tail[:, col : col + rank]).to(dtype))
        return d_wide, None, None, None, *([None] * (2 * len(weights))), *dBs


def wide_rows(rows: torch.Tensor, linears: list) -> torch.Tensor:
    """[x | s₁·u₁ | … | sₙ·uₙ] for `rows` [N, in]: one skinny GEMM over the stacked A."""
    A = torch.cat([linear.lora_A.to(rows.dtype) for linear in linears])
    u = rows @ A.t()
    scalings = [linear.scaling for linear in linears]
    if len(set(scalings)) == 1:
        u = u * scalings[0]
    else:
        parts = u.split([linear.rank for linear in linears], dim=1)
        u = torch.cat([part * s for part, s in zip(parts, scalings, strict=True)], dim=1)
    return torch.cat([rows, u], dim=1)


def project_wide(x: torch.Tensor, linears: list) -> list[torch.Tensor]:
    """The outputs of widened `LoRALinear`s reading `x` [..., in], in their order."""
    rows = as_rows(x)
    owners = [linear for linear in linears if linear.wide_layout[0] == 0]
    outputs = WideLoRA.apply(
        wide_rows(rows, linears),
        rows.requires_grad,
        sum(linear.rank for linear in linears),
        tuple(linear.wide_layout for linear in linears),
        *(linear.wide_weight for linear in owners),
        *(linear.wide_bias for linear in owners),
        *(linear.lora_B for linear in linears),
    )
    if len(owners) < len(linears):  # one stacked weight: its outputs side by side
        outputs = outputs[0].split([linear.base.out_features for linear in linears], dim=1)
    return [shaped_like(x, y) for y in outputs]
