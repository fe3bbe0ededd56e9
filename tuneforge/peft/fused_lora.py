"""A LoRA linear whose update is accumulated by the GEMM that makes it: y = x·Wᵀ, then
y += s·(x·Aᵀ)·Bᵀ in place (cuBLAS with beta = 1), and in backward dx = g·W + s·(g·B)·A the
same way. No full-width update tensor is written, then added, and backward needs only x and
the rank-r x·Aᵀ.

The two GEMMs form one custom operator, opaque to torch.compile: an out-of-place addmm copies
its full-width input into a new output first (one device copy per adapted linear and
step), and an in-place one on an intermediate is functionalised into the same copy.

Used by `LoRALinear` when the base is frozen, there is no dropout and the adapter computes in
the activations' dtype; `LoRALinear`'s plain expression is the reference path it is tested
against."""

import torch

OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define(
    "matmul_add_low_rank(Tensor left, Tensor right, Tensor low, Tensor up, float scaling, "
    "Tensor? bias=None) -> Tensor"
)


def _matmul_add_low_rank(
    left: torch.Tensor,
    right: torch.Tensor,
    low: torch.Tensor,
    up: torch.Tensor,
    scaling: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """left·right (+ bias) + scaling·low·up, the second GEMM accumulating into the first's
    output."""
    out = torch.mm(left, right) if bias is None else torch.addmm(bias, left, right)
    return out.addmm_(low, up, alpha=scaling)


# Registered through the dispatcher directly rather than `torch.library.custom_op`, whose
# Python wrappers cost tens of microseconds per call (a Llama-3-8B step makes 445 calls).
OPERATORS.impl("matmul_add_low_rank", _matmul_add_low_rank, "CompositeExplicitAutograd")


@torch.library.register_fake("tuneforge::matmul_add_low_rank")
def _(left, right, low, up, scaling, bias=None):
    return left.new_empty(left.shape[0], right.shape[1])


matmul_add_low_rank = torch.ops.tuneforge.matmul_add_low_rank.default


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., in] as 2-D rows [N, in] (no view outputs downstream for torch.compile to copy)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def shaped_like(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Rows `y` [N, out] back in `x`'s leading shape."""
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


class FusedLoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weight, bias, lora_A, lora_B, scaling: float):
        """`rows` [N, in]: 2-D, so that no output is a view (which torch.compile would copy)."""
        A, B = lora_A.to(rows.dtype), lora_B.to(rows.dtype)
        u = rows @ A.t()
        y = matmul_add_low_rank(rows, weight.t(), u, B.t(), scaling, bias)
        ctx.save_for_backward(rows, u, weight, A, B)
        ctx.scaling = scaling
        ctx.adapter_dtype = lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, weight, A, B = ctx.saved_tensors
        gu = grad @ B
        # the first block's input comes from a frozen embedding: no gradient to make there
        dx = None
        if ctx.needs_input_grad[0]:
            dx = matmul_add_low_rank(grad, weight, gu, A, ctx.scaling)
        dA = (gu.t() @ rows).mul_(ctx.scaling).to(ctx.adapter_dtype)
        dB = (grad.t() @ u).mul_(ctx.scaling).to(ctx.adapter_dtype)
        return dx, None, None, dA, dB, None
