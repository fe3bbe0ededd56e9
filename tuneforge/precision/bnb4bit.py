"""QLoRA's frozen base (Dettmers et al. 2023): each linear's weight held in 4 bits by
bitsandbytes — NF4 or FP4 codes in blocks of 64 with one absmax each, the absmaxes themselves
quantised to 8 bits with double quantisation — and dequantised into the activations' dtype (the
compute dtype) for each product, forward and backward; the dequantised weight is never kept. The
LoRA update reads the input as it is (`low_rank.py`). The dequantisation goes through
bitsandbytes' registered operators, so compiled blocks trace it. With `compute_in_fp8` the
products run in FP8 instead (`four_bit_fp8.py`)."""

import torch
from torch import nn

from tuneforge.models.cost import PROJECTION_NAMES
from tuneforge.peft.lora import LowPrecisionBase
from tuneforge.precision.bnb_codes import BLOCK, FourBitLayout, code_values, dequantize
from tuneforge.precision.four_bit_fp8 import FourBitFp8Product, fp8_multipliers
from tuneforge.precision.fp8 import Fp8Recipe
from tuneforge.precision.low_rank import low_rank_grads, low_rank_input


class Bnb4bitLinear(LowPrecisionBase):
    weight_codes: torch.Tensor
    weight_absmax: torch.Tensor
    nested_absmax: torch.Tensor | None
    nested_code: torch.Tensor | None
    absmax_offset: torch.Tensor | None

    def __init__(
        self,
        base: nn.Linear,
        quant_type: str,
        double_quant: bool,
        device: torch.device | None = None,
    ) -> None:
        """`device`: where the codes go (the weight is read from where it is, one at a time)."""
        import bitsandbytes.functional as bnb

        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.bias = base.bias
        self.quant_type, self.double_quant = quant_type, double_quant
        with torch.no_grad():
            codes, state = bnb.quantize_4bit(
                base.weight.detach().to(device or base.weight.device), blocksize=BLOCK,
                quant_type=quant_type, compress_statistics=double_quant,
                quant_storage=torch.uint8,
            )  # fmt: skip
        nested = state.state2 if state.nested else None
        self.layout = FourBitLayout(
            state.blocksize, quant_type, (self.out_features, self.in_features),
            nested.blocksize if nested is not None else 0,
        )  # fmt: skip
        # buffers: they move with the module (not saved: made again from the weights on load)
        for name, tensor in {
            "weight_codes": codes,
            "weight_absmax": state.absmax,
            "nested_absmax": None if nested is None else nested.absmax,
            "nested_code": None if nested is None else nested.code,
            "absmax_offset": None if nested is None else torch.as_tensor(state.offset),
        }.items():
            self.register_buffer(name, tensor, persistent=False)
        self.fp8: Fp8Recipe | None = None

    def compute_in_fp8(self, recipe: Fp8Recipe) -> None:
        """Products in FP8 from here on (`four_bit_fp8.py`), the scales computed once."""
        held = self._held()[:5]
        rowwise = recipe.scaling == "rowwise"
        multiplier = fp8_multipliers(held, self.layout, rowwise)
        self.register_buffer("fp8_multiplier", multiplier, persistent=False)
        scale = multiplier.reciprocal()
        scale = scale.reshape(1, -1) if rowwise else scale[0].clone()
        self.register_buffer("fp8_scale", scale, persistent=False)
        values = code_values(self.quant_type, multiplier.device)
        self.register_buffer("code_values", values, persistent=False)
        self.fp8 = recipe

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        codes, absmax, nested_absmax, nested_code, offset, layout = self._held()
        return dequantize(codes, absmax, nested_absmax, nested_code, offset, layout, dtype)

    def _held(self) -> tuple:
        return (
            self.weight_codes, self.weight_absmax, self.nested_absmax, self.nested_code,
            self.absmax_offset, self.layout,
        )  # fmt: skip

    def product(self, rows, lora_A=None, lora_B=None, scaling=0.0):
        if self.fp8 is None:
            return Bnb4bitProduct.apply(rows, *self._held(), self.bias, lora_A, lora_B, scaling)
        return FourBitFp8Product.apply(
            rows, *self._held()[:5], self.code_values, self.fp8_multiplier, self.fp8_scale,
            self.layout,
            self.bias, lora_A, lora_B, scaling, self.fp8,
        )  # fmt: skip

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers(recurse=False))


class Bnb4bitProduct(torch.autograd.Function):
    """`rows` [N, in] times the dequantised weight (+ bias) (+ s·(rows·Aᵀ)·Bᵀ); backward
    dequantises again for the input gradient instead of keeping the weight."""

    @staticmethod
    def forward(
        ctx, rows, codes, absmax, nested_absmax, nested_code, offset, layout, bias, lora_A,
        lora_B, scaling,
    ):  # fmt: skip
        held = (codes, absmax, nested_absmax, nested_code, offset)
        y = rows @ dequantize(*held, layout, rows.dtype).t()
        if bias is not None:
            y = y + bias
        u, A, B = low_rank_input(rows, lora_A, lora_B)
        if u is not None:
            y = y.addmm_(u, B.t(), alpha=scaling)
        ctx.save_for_backward(rows if u is not None else None, u, A, B, *held)
        ctx.layout, ctx.scaling = layout, scaling
        ctx.adapter_dtype = None if lora_A is None else lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, A, B, codes, absmax, nested_absmax, nested_code, offset = ctx.saved_tensors

        def input_grad() -> torch.Tensor:
            weight = dequantize(
                codes, absmax, nested_absmax, nested_code, offset, ctx.layout, grad.dtype
            )
            return grad @ weight

        dx, dA, dB = low_rank_grads(
            grad, rows, u, A, B, ctx.scaling, ctx.adapter_dtype,
            input_grad if ctx.needs_input_grad[0] else None,
        )  # fmt: skip
        return dx, None, None, None, None, None, None, None, dA, dB, None


@torch.no_grad()
def round_through_4bit(weight: torch.Tensor, quant_type: str, double_quant: bool) -> torch.Tensor:
    """`weight` as the 4-bit base holds it, dequantised to its dtype: what an adapter trained on
    it was trained against."""
    import bitsandbytes.functional as bnb

    codes, state = bnb.quantize_4bit(
        weight, blocksize=BLOCK, quant_type=quant_type, compress_statistics=double_quant,
        quant_storage=torch.uint8,
    )  # fmt: skip
    return bnb.dequantize_4bit(codes, state).to(weight.dtype)


@torch.no_grad()
def quantize_on_arrival(
    model, quant_type: str, double_quant: bool, device: torch.device
) -> dict[nn.Linear, Bnb4bitLinear]:
    """Each projection of the decoder blocks (in host memory) quantised onto `device`, its weight
    replaced by a placeholder of one element on `device` (its shape, dtype and place for the
    adapters made on it; never read). Returns the 4-bit projections by the placeholder linear
    each stands in for, for the precision step to swap in (`converters.FourBitBase`)."""
    arrived = {}
    for name, module in model.layers.named_modules():
        if name.rsplit(".", 1)[-1] not in PROJECTION_NAMES or not isinstance(module, nn.Linear):
            continue
        four_bit = Bnb4bitLinear(module, quant_type, double_quant, device)
        weight = module.weight
        placeholder = torch.empty(1, dtype=weight.dtype, device=device).expand(weight.shape)
        module.weight = nn.Parameter(placeholder, requires_grad=False)
        if module.bias is not None:
            module.bias = nn.Parameter(module.bias.to(device), requires_grad=False)
            four_bit.bias = module.bias
        arrived[module] = four_bit
    return arrived
