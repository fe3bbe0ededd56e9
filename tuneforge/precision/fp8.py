"""FP8 scaling, as `torch._scaled_mm` takes it: a tensor is held as FP8 values q and fp32 scales
s with x ≈ q · s, the scales dividing each row's (`rowwise`) or the whole tensor's (`tensorwise`)
largest magnitude by the format's largest value, so that the amax maps onto it. E4M3 (±448,
3 mantissa bits) for activations and weights; E5M2 (±57,344, 2 mantissa bits) for gradients in
the `hybrid` recipe, whose range they need more than precision."""

from dataclasses import dataclass

import torch

from tuneforge.hardware.gpus import gfx_target

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_FNUZ = torch.float8_e4m3fnuz
E5M2_FNUZ = torch.float8_e5m2fnuz
"""MI300's (gfx942) FP8 formats: no negative zero, one NaN, and E4M3's largest value 240."""
FORMAT_NAMES = {E4M3: "E4M3", E5M2: "E5M2", E4M3_FNUZ: "E4M3 FNUZ", E5M2_FNUZ: "E5M2 FNUZ"}
AMAX_FLOOR = 1e-12
"""An all-zero row or tensor gets this amax: its scale stays finite and its values zero."""
SCALINGS = ("tensorwise", "rowwise")
GEMM_MULTIPLE = 16
"""`torch._scaled_mm` needs the reduction and output widths to be multiples of 16."""


def largest(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


@dataclass(frozen=True)
class Fp8Recipe:
    """`forward`: the activations' and weights' format; `backward`: the output gradients';
    `scaling`: one scale per row (a token, an output channel) or per tensor."""

    forward: torch.dtype = E4M3
    backward: torch.dtype = E4M3
    scaling: str = "rowwise"

    @classmethod
    def of(cls, fp8: str, scaling: str, fnuz: bool = False) -> "Fp8Recipe":
        """`fnuz`: MI300's formats (`fnuz_formats`) instead of the OCP ones."""
        if fp8 not in ("e4m3", "hybrid"):
            raise ValueError(f"precision.fp8 must be e4m3 or hybrid, not {fp8!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"precision.fp8_scaling must be one of {SCALINGS}, not {scaling!r}")
        e4m3, e5m2 = (E4M3_FNUZ, E5M2_FNUZ) if fnuz else (E4M3, E5M2)
        return cls(e4m3, e5m2 if fp8 == "hybrid" else e4m3, scaling)

    def describe(self) -> str:
        forward, backward = FORMAT_NAMES[self.forward], FORMAT_NAMES[self.backward]
        return f"{forward} forward, {backward} gradients, {self.scaling}"


def fnuz_formats(device: torch.device) -> bool:
    """Whether FP8 on `device` takes MI300's FNUZ formats: its tensor cores (gfx942) have no
    others, where MI350 (gfx950) and NVIDIA's take the OCP E4M3 and E5M2."""
    return gfx_target(device) == "gfx942"


def quantize(
    values: torch.Tensor, dtype: torch.dtype, rowwise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` [rows, cols] as FP8 and their scales: [rows, 1] rowwise, a 0-d tensor otherwise.
    Plain torch operations, so that torch.compile fuses them into the kernel that made `values`."""
    magnitude = values.abs()
    amax = magnitude.amax(dim=-1, keepdim=True) if rowwise else magnitude.amax()
    return _scaled(values, dtype, amax)


def _scaled(
    values: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` scaled so that `amax` meets the format's largest value, in it, and the scale."""
    limit = largest(dtype)
    # in float64: compiled and eager fp32 divisions round differently (torchao does the same)
    multiplier = (limit / amax.double().clamp(min=AMAX_FLOOR)).float()
    quantized = (values.float() * multiplier).clamp(-limit, limit).to(dtype)
    return quantized, multiplier.reciprocal()


WEIGHT_CHUNK_ROWS = 1024
"""Rows of a weight quantised at a time, once: its transient fp32 copy stays small (a base held
only in FP8 is converted on a GPU that holds little more than the bf16 model)."""


def quantize_weight(
    weight: torch.Tensor, dtype: torch.dtype, rowwise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` of a weight, `WEIGHT_CHUNK_ROWS` rows at a time: the same values and scales."""
    rows = weight.shape[0]
    if rows <= WEIGHT_CHUNK_ROWS:
        return quantize(weight, dtype, rowwise)
    quantized = torch.empty_like(weight, dtype=dtype)
    if rowwise:
        scales = weight.new_empty((rows, 1), dtype=torch.float32)
        for start in range(0, rows, WEIGHT_CHUNK_ROWS):
            chunk = slice(start, start + WEIGHT_CHUNK_ROWS)
            quantized[chunk], scales[chunk] = quantize(weight[chunk], dtype, True)
        return quantized, scales
    amax = torch.stack([weight[s : s + WEIGHT_CHUNK_ROWS].abs().amax()
                        for s in range(0, rows, WEIGHT_CHUNK_ROWS)]).amax()  # fmt: skip
    for start in range(0, rows, WEIGHT_CHUNK_ROWS):
        chunk = slice(start, start + WEIGHT_CHUNK_ROWS)
        quantized[chunk], scale = _scaled(weight[chunk], dtype, amax)
    return quantized, scale


def dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (values.float() * scale).to(dtype)


def fits_scaled_mm(in_features: int, out_features: int) -> bool:
    return in_features % GEMM_MULTIPLE == 0 and out_features % GEMM_MULTIPLE == 0
