"""A frozen linear's product with FP4 numerics emulated: the input (forward) and the output
gradient (backward) quantised in the recipe's blocks along the GEMM's reduction dimension and
dequantised, the weight dequantised from its FP4 codes, the GEMMs in the activations' dtype.
This is what an FP4 GEMM computes, up to its accumulation order, on any GPU; it is slower than
bf16, not faster. The output gradients round stochastically, as NVIDIA's NVFP4 training recipe
rounds them: to nearest, the many entries below a twenty-fourth of their block's largest would all vanish. The
LoRA update reads the unquantised input, as the adapters stay in bf16."""

import torch

from tuneforge.precision.fp4 import Fp4Tensor, quantize_fp4


def fake_quantize(values: torch.Tensor, recipe: str, stochastic: bool = False) -> torch.Tensor:
    """`values` rounded to the FP4 recipe's grid, blocks along the last dimension."""
    return quantize_fp4(values, recipe, stochastic).dequantize(values.dtype)


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
        u = A = B = None
        if lora_A is not None and lora_B is not None:
            A, B = lora_A.to(rows.dtype), lora_B.to(rows.dtype)
            u = rows @ A.t()
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
        gu = None if B is None else grad @ B
        dx = None
        if ctx.needs_input_grad[0]:
            weight = _weight(stored, scales, tensor_scale, ctx.recipe, grad.dtype)
            dx = fake_quantize(grad, ctx.recipe, stochastic=True) @ weight
            if gu is not None:
                dx.addmm_(gu, A, alpha=ctx.scaling)
        dA = dB = None
        if gu is not None:
            dA = (gu.t() @ rows).mul_(ctx.scaling).to(ctx.adapter_dtype)
            dB = (grad.t() @ u).mul_(ctx.scaling).to(ctx.adapter_dtype)
        return dx, None, None, None, None, dA, dB, None, None
