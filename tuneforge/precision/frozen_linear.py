"""Frozen base linears that compute in a low-precision format, swapped in under a LoRA adapter
(`LoRALinear.base`). The quantised weights are buffers that are not saved: checkpoints hold
what trains, and a run's base is the model it loaded. Where the bf16 weight is kept too, it
stays the module's `weight` parameter, exactly as loaded."""

from dataclasses import dataclass

import torch
from torch import nn

from tuneforge.peft.lora import LowPrecisionBase
from tuneforge.precision.fp4 import quantize_fp4
from tuneforge.precision.fp4_product import Fp4LoRAProduct
from tuneforge.precision.fp8 import Fp8Recipe, quantize_weight
from tuneforge.precision.fp8_product import Fp8LoRAProduct


def _keep(module: LowPrecisionBase, base: nn.Linear, keep_weight: bool) -> None:
    module.in_features, module.out_features = base.in_features, base.out_features
    module.bias = base.bias
    if keep_weight:
        module.weight = base.weight


@dataclass
class Fp8Stack:
    """The stacked FP8 weight [Σ out, in], its scales [1, Σ out] and bias of linears reading one
    input (`precision/stacked_fp8.py`), held by the first."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    out_features: list[int]


class Fp8Linear(LowPrecisionBase):
    """The weight quantised once, per output channel (`rowwise`) or per tensor; the input per
    token or per tensor at each call (`precision/fp8_product.py`)."""

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(self, base: nn.Linear, recipe: Fp8Recipe, keep_weight: bool) -> None:
        super().__init__()
        _keep(self, base, keep_weight)
        self.recipe = recipe
        rowwise = recipe.scaling == "rowwise"
        with torch.no_grad():
            weight, scale = quantize_weight(base.weight, recipe.forward, rowwise)
        self.register_buffer("weight_fp8", weight, persistent=False)
        self.register_buffer(
            "weight_scale", scale.reshape(1, -1) if rowwise else scale, persistent=False
        )
        self.stack: Fp8Stack | None = None

    def _apply(self, fn, recurse=True):
        # moved or cast, the weights are no longer views of the stacked tensor
        self.stack = None
        return super()._apply(fn, recurse)

    def product(self, rows, lora_A=None, lora_B=None, scaling=0.0):
        recipe = self.recipe
        return Fp8LoRAProduct.apply(
            rows,
            self.weight_fp8,
            self.weight_scale,
            self.bias,
            lora_A,
            lora_B,
            scaling,
            recipe.forward,
            recipe.backward,
            recipe.scaling == "rowwise",
        )

    def weight_bytes(self) -> int:
        return self.weight_fp8.numel() + 4 * self.weight_scale.numel()

    def product_together(self, rows, adapters):
        """One product for the stacked linears: x·[W_q; W_k; W_v]ᵀ + (x·[A_q; A_k; A_v]ᵀ)·Bᵀ with
        B block-diagonal (each block scaled by its adapter's scaling where they differ)."""
        stack = self.stack
        if stack is None or len(adapters) != len(stack.out_features):
            return None
        scalings = [adapter.scaling for adapter in adapters]
        common = scalings[0] if len(set(scalings)) == 1 else None
        A = torch.cat([adapter.lora_A for adapter in adapters])
        B = torch.block_diag(
            *(
                adapter.lora_B if common is not None else adapter.lora_B * adapter.scaling
                for adapter in adapters
            )
        )
        recipe = self.recipe
        y = Fp8LoRAProduct.apply(
            rows,
            stack.weight,
            stack.scale,
            stack.bias,
            A,
            B,
            common if common is not None else 1.0,
            recipe.forward,
            recipe.backward,
            True,
        )
        return list(y.split(stack.out_features, dim=1))


class Fp4Linear(LowPrecisionBase):
    """FP4 numerics emulated: inputs and output gradients quantised and dequantised at each call,
    the product in the activations' dtype. The weight quantised once in square tiles (16 × 16
    NVFP4, 32 × 32 MXFP4), one scale each, so that the one copy is blocked along the reduction
    dimension of both of its GEMMs, as FP4 tensor cores need it. `packed`: only its codes and
    scales are held (about 4.5 bits per weight with NVFP4's scales) and it is dequantised at
    each use; otherwise its dequantised values are held in the activations' dtype. `sharded`:
    the codes and block scales are frozen parameters (as bytes), which FSDP2 shards and
    all-gathers as they are: FP4 over the wire."""

    weight_codes: torch.Tensor
    weight_scales: torch.Tensor
    weight_tensor_scale: torch.Tensor | None
    weight_dequantized: torch.Tensor

    def __init__(
        self,
        base: nn.Linear,
        recipe: str,
        packed: bool,
        keep_weight: bool,
        sharded: bool = False,
    ) -> None:
        super().__init__()
        _keep(self, base, keep_weight)
        self.recipe, self.packed = recipe, packed
        self.dtype = base.weight.dtype
        with torch.no_grad():
            quantized = quantize_fp4(base.weight, recipe, square=True)
        self.scale_dtype = quantized.scales.dtype
        if packed:
            self.register_buffer("weight_tensor_scale", quantized.tensor_scale, persistent=False)
        if packed and sharded:
            bits = quantized.scales.view(torch.uint8)
            self.weight_codes = nn.Parameter(quantized.codes, requires_grad=False)
            self.weight_scales = nn.Parameter(bits, requires_grad=False)
        elif packed:
            self.register_buffer("weight_codes", quantized.codes, persistent=False)
            self.register_buffer("weight_scales", quantized.scales, persistent=False)
        else:
            self.register_buffer(
                "weight_dequantized", quantized.dequantize(self.dtype), persistent=False
            )

    # eager inside compiled blocks: Inductor's fp32 division is not correctly rounded, which
    # moves values that sit on the FP4 grid's rounding boundaries
    @torch.compiler.disable
    def product(self, rows, lora_A=None, lora_B=None, scaling=0.0):
        if self.packed:
            stored, scales = self.weight_codes, self.weight_scales
            if scales.dtype != self.scale_dtype:  # held as bytes to be sharded
                scales = scales.to(torch.uint8).view(self.scale_dtype)
            tensor_scale = self.weight_tensor_scale
        else:
            stored, scales, tensor_scale = self.weight_dequantized, None, None
        return Fp4LoRAProduct.apply(
            rows, stored, scales, tensor_scale, self.bias, lora_A, lora_B, scaling, self.recipe
        )

    def weight_bytes(self) -> int:
        if not self.packed:
            return self.weight_dequantized.numel() * self.weight_dequantized.element_size()
        scale_bytes = self.weight_scales.numel() * self.weight_scales.element_size()
        tensor_scale = 0 if self.weight_tensor_scale is None else 4
        return self.weight_codes.numel() + scale_bytes + tensor_scale
