"""A frozen linear's product in FP8 with a LoRA update accumulated into it: y = x·Wᵀ through
`torch._scaled_mm` (x quantised per token or per tensor, W quantised once), then
y += s·(x·Aᵀ)·Bᵀ in place; in backward dx = g·W the same way, + s·(g·B)·A. The adapters, their
gradients and the LoRA path's input stay in the activations' dtype.

The weight is held as [out, in] (reduction along its rows, as the forward GEMM needs); the
input gradient's GEMM reduces along `out`, so it reads a transposed copy made for that GEMM and
freed after it (Hopper's FP8 tensor cores take both operands with the reduction dimension
contiguous). With per-output-channel weight scales, the scales are folded into the output
gradient before it is quantised: g·diag(s_W)·W_q = (g·s_W)·W_q."""

import torch

from tuneforge.precision.fp8 import quantize
from tuneforge.precision.low_rank import low_rank_grads, low_rank_input

OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define(
    "scaled_mm_add_low_rank(Tensor left, Tensor right, Tensor left_scale, Tensor right_scale, "
    "ScalarType out_dtype, Tensor? low=None, Tensor? up=None, float scaling=0.0, "
    "Tensor? bias=None) -> Tensor"
)


def _scaled_mm_add_low_rank(
    left: torch.Tensor,
    right: torch.Tensor,
    left_scale: torch.Tensor,
    right_scale: torch.Tensor,
    out_dtype: torch.dtype,
    low: torch.Tensor | None = None,
    up: torch.Tensor | None = None,
    scaling: float = 0.0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """(left·s_left)·(right·s_right) in `out_dtype` (+ bias) + scaling·low·up, accumulated
    into the FP8 GEMM's output."""
    out = torch._scaled_mm(left, right, left_scale, right_scale, out_dtype=out_dtype)
    if bias is not None:
        out.add_(bias)
    if low is not None and up is not None:
        out.addmm_(low, up, alpha=scaling)
    return out


# one opaque operator, as `matmul_add_low_rank`: no full-width copy for the in-place update
OPERATORS.impl("scaled_mm_add_low_rank", _scaled_mm_add_low_rank, "CompositeExplicitAutograd")


@torch.library.register_fake("tuneforge::scaled_mm_add_low_rank")
def _(left, right, left_scale, right_scale, out_dtype, low=None, up=None, scaling=0.0, bias=None):
    return left.new_empty(left.shape[0], right.shape[1], dtype=out_dtype)


scaled_mm_add_low_rank = torch.ops.tuneforge.scaled_mm_add_low_rank.default


class Fp8LoRAProduct(torch.autograd.Function):
    """`rows` [N, in]; `weight` [out, in] FP8 and its scales ([1, out] rowwise, 0-d
    tensorwise); `lora_A`, `lora_B` None for the base product alone."""

    @staticmethod
    def forward(
        ctx,
        rows,
        weight,
        weight_scale,
        bias,
        lora_A,
        lora_B,
        scaling: float,
        forward_dtype: torch.dtype,
        backward_dtype: torch.dtype,
        rowwise: bool,
    ):
        y, u, A, B = fp8_forward(
            rows, weight, weight_scale, bias, lora_A, lora_B, scaling, forward_dtype, rowwise
        )
        ctx.save_for_backward(rows if u is not None else None, u, weight, weight_scale, A, B)
        ctx.scaling, ctx.backward_dtype, ctx.rowwise = scaling, backward_dtype, rowwise
        ctx.adapter_dtype = None if lora_A is None else lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, weight, weight_scale, A, B = ctx.saved_tensors

        def input_grad() -> torch.Tensor:
            columns = weight.t().contiguous().t()  # [out, in] with `out` contiguous
            return fp8_input_grad(grad, columns, weight_scale, ctx.backward_dtype, ctx.rowwise)

        dx, dA, dB = low_rank_grads(
            grad, rows, u, A, B, ctx.scaling, ctx.adapter_dtype,
            input_grad if ctx.needs_input_grad[0] else None,
        )  # fmt: skip
        return dx, None, None, None, dA, dB, None, None, None, None


def fp8_forward(rows, weight, weight_scale, bias, lora_A, lora_B, scaling, dtype, rowwise):
    """(y, u, A, B): y = rows·Wᵀ (+ bias) + s·u·Bᵀ with rows quantised to `dtype`, for FP8 W
    [out, in] and its scales; u = rows·Aᵀ and the adapters in the rows' dtype (Nones without)."""
    quantized, scale = quantize(rows, dtype, rowwise)
    u, A, B = low_rank_input(rows, lora_A, lora_B)
    up = None if B is None else B.t()
    y = scaled_mm_add_low_rank(
        quantized, weight.t(), scale, weight_scale, rows.dtype, u, up, scaling, bias
    )
    return y, u, A, B


def fp8_input_grad(
    grad: torch.Tensor,
    columns: torch.Tensor,
    weight_scale: torch.Tensor,
    dtype: torch.dtype,
    rowwise: bool,
) -> torch.Tensor:
    """g·W for FP8 W given as `columns`, [out, in] with `out` contiguous (the layout the FP8
    GEMM reads for this product), with its scales: the per-channel ones folded into g."""
    if rowwise:
        quantized, scale = quantize(grad * weight_scale, dtype, rowwise=True)
        ones = torch.ones(1, columns.shape[1], device=grad.device, dtype=torch.float32)
        return scaled_mm_add_low_rank(quantized, columns, scale, ones, grad.dtype)
    quantized, scale = quantize(grad, dtype, rowwise=False)
    return scaled_mm_add_low_rank(quantized, columns, scale, weight_scale, grad.dtype)
