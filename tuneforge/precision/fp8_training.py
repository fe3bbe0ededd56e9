"""A trained linear whose three products run in FP8 (full fine-tuning): the weight stays in the
model's dtype (the optimizer's master copy) and is quantised at each step, as torchao's float8
training does — y = x·Wᵀ, dx = g·W, dW = gᵀ·x, each operand quantised along its product's
reduction dimension (`rowwise`: one scale per row of the result, i.e. per token and per
channel; `tensorwise`: one per tensor), E4M3, or E5M2 for output gradients with `hybrid`.

The weight's gradient reduces over the tokens, which `torch._scaled_mm` needs in multiples of
16: its operands are padded with zero tokens, which add nothing."""

import torch
from torch import nn
from torch.nn import functional as F

from tuneforge.peft.fused_lora import as_rows, shaped_like
from tuneforge.precision.fp8 import GEMM_MULTIPLE, Fp8Recipe, quantize
from tuneforge.precision.fp8_product import scaled_mm_add_low_rank


def scaled_product(
    left: torch.Tensor, right_rows: torch.Tensor, left_dtype, right_dtype, rowwise: bool, out_dtype
) -> torch.Tensor:
    """left [M, K] · right_rowsᵀ, where `right_rows` [N, K] (contiguous) holds the second
    operand's columns as rows: both quantised along K, the product's reduction."""
    left_q, left_scale = quantize(left, left_dtype, rowwise)
    right_q, right_scale = quantize(right_rows, right_dtype, rowwise)
    if rowwise:
        right_scale = right_scale.reshape(1, -1)
    return scaled_mm_add_low_rank(left_q, right_q.t(), left_scale, right_scale, out_dtype)


class Fp8TrainingProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weight, bias, forward_dtype, backward_dtype, rowwise: bool):
        y = scaled_product(rows, weight, forward_dtype, forward_dtype, rowwise, rows.dtype)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(rows, weight)
        ctx.dtypes, ctx.rowwise = (forward_dtype, backward_dtype), rowwise
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        forward_dtype, backward_dtype = ctx.dtypes
        rowwise = ctx.rowwise
        dx = dW = dbias = None
        if ctx.needs_input_grad[0]:  # g [N, out] · W [out, in]: W's columns as rows
            dx = scaled_product(
                grad, weight.t().contiguous(), backward_dtype, forward_dtype, rowwise, grad.dtype
            )
        if ctx.needs_input_grad[1]:  # gᵀ [out, N] · x [N, in]: reduced over the tokens
            padding = -grad.shape[0] % GEMM_MULTIPLE
            grad_t = F.pad(grad, (0, 0, 0, padding)).t().contiguous()
            rows_t = F.pad(rows, (0, 0, 0, padding)).t().contiguous()
            dW = scaled_product(
                grad_t, rows_t, backward_dtype, forward_dtype, rowwise, weight.dtype
            )
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = grad.sum(0)
        return dx, dW, dbias, None, None, None


class Fp8TrainingLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) computing in FP8."""

    def __init__(self, linear: nn.Linear, recipe: Fp8Recipe) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recipe = self.recipe
        y = Fp8TrainingProduct.apply(
            as_rows(x),
            self.weight,
            self.bias,
            recipe.forward,
            recipe.backward,
            recipe.scaling == "rowwise",
        )
        return shaped_like(x, y)
