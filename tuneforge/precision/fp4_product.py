"""A frozen linear's product with FP4 numerics emulated: the input (forward) and the output
gradient (backward) quantised in the recipe's blocks along the GEMM's reduction dimension and
dequantised, the weight dequantised from its FP4 codes, the GEMMs in the activations' dtype.
This is what an FP4 GEMM computes, up to its accumulation order, on any GPU; it is slower than
bf16, not faster. The output gradients round stochastically, as NVIDIA's NVFP4 training recipe
rounds them: to nearest, the many entries below a twenty-fourth of their block's largest would all vanish. The
LoRA update reads the unquantised input, as the adapters stay in bf16."""

import torch

from tuneforge.precision.fp4 import Fp4Tensor, fake_quantize
from tuneforge.precision.low_rank import low_rank_grads, low_rank_input


def _weight(stored, scales, tensor_scale, recipe: str, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised weight: `stored` is its codes when `scales` is given, else the values."""
    if scales is None:
        return stored
    return Fp4Tensor(stored, scales, recipe, tensor_scale).dequantize(dtype)


class Fp4LoRAProduct(torch.autograd.Function):
    """`rows` [N, in]; the weight as FP4 codes, block scales and tensor scale, or (`scales`
    None) as its dequantised values [out, in]; `lora_A`, `lora_B` None for the base alone."""

    @staticmethod
    def forward(ctx, rows, stored, scales, tensor_scale, bias, lora_A, lora_B, scaling, recipe):
        weight = _weight(stored, scales, tensor_scale, recipe, rows.dtype)
        y = fake_quantize(rows, recipe) @ weight.t()
        if bias is not None:
            y = y + bias
        u, A, B = low_rank_input(rows, lora_A, lora_B)
        if u is not None:
            y = y.addmm_(u, B.t(), alpha=scaling)
        ctx.save_for_backward(
            rows if u is not None else None, u, stored, scales, tensor_scale, A, B
        )
        ctx.scaling, ctx.recipe = scaling, recipe
        ctx.adapter_dtype = None if lora_A is None else lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, stored, scales, tensor_scale, A, B = ctx.saved_tensors

        def input_grad() -> torch.Tensor:
            weight = _weight(stored, scales, tensor_scale, ctx.recipe, grad.dtype)
            return fake_quantize(grad, ctx.recipe, stochastic=True) @ weight

        dx, dA, dB = low_rank_grads(
            grad, rows, u, A, B, ctx.scaling, ctx.adapter_dtype,
            input_grad if ctx.needs_input_grad[0] else None,
        )  # fmt: skip
        return dx, None, None, None, None, dA, dB, None, None
