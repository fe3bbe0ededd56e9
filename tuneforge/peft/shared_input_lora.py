"""Fused LoRA linears that read the same input (q, k and v; gate and up), computed together:
their adapters' x·Aᵀ as one skinny GEMM over the stacked A (the input read once, not once per
adapter), and in backward the input gradient Σ gᵢ·Wᵢ + Σ sᵢ·(gᵢ·Bᵢ)·Aᵢ accumulated by its GEMMs
into one output, and the A gradients as one GEMM over the input. Outputs and gradients are each
linear's own LoRA expression (`LoRALinear`'s plain path, the tests' reference)."""

import torch

from tuneforge.peft.fused_lora import matmul_add_low_rank

OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define("matmul_sum(Tensor[] lefts, Tensor[] rights) -> Tensor")


def _matmul_sum(lefts: list[torch.Tensor], rights: list[torch.Tensor]) -> torch.Tensor:
    """Σ leftᵢ·rightᵢ, each GEMM after the first accumulating into the first's output."""
    out = torch.mm(lefts[0], rights[0])
    for left, right in zip(lefts[1:], rights[1:], strict=True):
        out.addmm_(left, right)
    return out


# One opaque operator, as `matmul_add_low_rank`: torch.compile would functionalise the in-place
# accumulation into copies of the full-width output.
OPERATORS.impl("matmul_sum", _matmul_sum, "CompositeExplicitAutograd")


@torch.library.register_fake("tuneforge::matmul_sum")
def _(lefts, rights):
    return lefts[0].new_empty(lefts[0].shape[0], rights[0].shape[1])


matmul_sum = torch.ops.tuneforge.matmul_sum.default


class SharedInputLoRA(torch.autograd.Function):
    """`rows` [N, in] and, for n linears, their frozen weights, biases (or None), A, B and
    scalings; returns the n outputs."""

    @staticmethod
    def forward(ctx, rows, scalings: tuple[float, ...], *tensors):
        count = len(scalings)
        weights, biases = tensors[:count], tensors[count : 2 * count]
        lora_As, lora_Bs = tensors[2 * count : 3 * count], tensors[3 * count :]
        A = torch.cat([a.to(rows.dtype) for a in lora_As])
        Bs = [b.to(rows.dtype) for b in lora_Bs]
        u = rows @ A.t()
        outputs, start = [], 0
        for weight, bias, B, scaling in zip(weights, biases, Bs, scalings, strict=True):
            low = u[:, start : start + B.shape[1]]
            outputs.append(matmul_add_low_rank(rows, weight.t(), low, B.t(), scaling, bias))
            start += B.shape[1]
        ctx.save_for_backward(rows, u, A, *weights, *Bs)
        ctx.scalings = scalings
        ctx.adapter_dtypes = [a.dtype for a in lora_As]
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        count = len(ctx.scalings)
        rows, u, A, *rest = ctx.saved_tensors
        weights, Bs = rest[:count], rest[count:]
        gu = torch.cat(
            [(g @ B).mul_(s) for g, B, s in zip(grads, Bs, ctx.scalings, strict=True)], dim=1
        )
        dx = None
        if ctx.needs_input_grad[0]:
            dx = matmul_sum([*grads, gu], [*weights, A])
        dA = gu.t() @ rows
        dAs, dBs, start = [], [], 0
        for g, B, s, dtype in zip(grads, Bs, ctx.scalings, ctx.adapter_dtypes, strict=True):
            rank = B.shape[1]
            dAs.append(dA[start : start + rank].to(dtype))
            dBs.append((g.t() @ u[:, start : start + rank]).mul_(s).to(dtype))
            start += rank
        return dx, None, *([None] * (2 * count)), *dAs, *dBs


class StackedSharedInputLoRA(torch.autograd.Function):
    """As `SharedInputLoRA`, over frozen weights stacked into one [Σ out, in] tensor
    (`peft/stacked_weights.py`): one base GEMM each way, and the updates as one GEMM over the
    block-diagonal B. `rows` [N, in], the stacked weight and bias (or None), then the n
    adapters' A and B; returns the outputs side by side, [N, Σ out]."""

    @staticmethod
    def forward(ctx, rows, scalings: tuple[float, ...], weight, bias, *adapters):
        count = len(scalings)
        lora_As, lora_Bs = adapters[:count], adapters[count:]
        common = scalings[0] if len(set(scalings)) == 1 else None
        A = torch.cat([a.to(rows.dtype) for a in lora_As])
        B = torch.block_diag(
            *(
                b.to(rows.dtype) if common is not None else b.to(rows.dtype) * s
                for b, s in zip(lora_Bs, scalings, strict=True)
            )
        )
        u = rows @ A.t()
        y = matmul_add_low_rank(rows, weight.t(), u, B.t(), common or 1.0, bias)
        ctx.save_for_backward(rows, u, A, weight, B)
        ctx.scalings, ctx.common = scalings, common
        ctx.blocks = [
            (b.shape[0], b.shape[1], a.dtype) for a, b in zip(lora_As, lora_Bs, strict=True)
        ]
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, A, weight, B = ctx.saved_tensors
        gu = grad @ B  # each block's gᵢ·Bᵢ (with a scaling of its own, already scaled)
        if ctx.common is not None:
            gu.mul_(ctx.common)
        dx = matmul_sum([grad, gu], [weight, A]) if ctx.needs_input_grad[0] else None
        dA = gu.t() @ rows
        dB = grad.t() @ u  # every pair of blocks; the diagonal ones are the B gradients
        dAs, dBs, row, col = [], [], 0, 0
        for (outs, rank, dtype), scaling in zip(ctx.blocks, ctx.scalings, strict=True):
            dAs.append(dA[col : col + rank].to(dtype))
            dBs.append((dB[row : row + outs, col : col + rank] * scaling).to(dtype))
            row, col = row + outs, col + rank
        return dx, None, None, None, *dAs, *dBs
