"""The FP4 formats, exactly as they are defined: E2M1 elements (a sign, two exponent bits, one
mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) in blocks along the last dimension that share one
scale. Blocks never straddle rows.

- MXFP4 (OCP Microscaling Formats v1.0): 32 elements, an E8M0 scale (a power of two, stored as
  its biased exponent; 0xFF is NaN) of 2^(floor(log2(amax)) - 2), 2 being the largest exponent of
  E2M1; elements beyond ±6 after scaling saturate.
- NVFP4: 16 elements, an E4M3 scale of amax / 6, relative to an fp32 tensor scale of
  amax / (6 * 448) (448: E4M3's largest value), so that the block scales use E4M3's whole range.

Elements round to nearest, ties to even, and saturate at ±6. Two codes share a byte, the first in
the low nibble (the layout of torch's `float4_e2m1fn_x2`). A block holding NaN or ±Inf gets a NaN
scale: it dequantises to NaN, the other blocks are untouched.
"""

from dataclasses import dataclass

import torch

E2M1_MAX = 6.0
E2M1_MAX_EXPONENT = 2
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The magnitudes of codes 0-7; codes 8-15 are the same, negative."""
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E4M3_MAX = 448.0
E4M3_TINY = 2.0**-6
"""E4M3's smallest normal value: the least block scale NVFP4 stores."""
E8M0_BIAS = 127
E8M0_NAN = 255
BLOCK_SIZE = {"mxfp4": 32, "nvfp4": 16}


def e2m1_codes(values: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
    """4-bit codes (uint8, one per element) of `values`, rounded to nearest, ties to even, or
    (`stochastic`) up or down with the probability of the distance to the other neighbour, so
    that the rounding is unbiased on average (gradients in NVFP4 training recipes)."""
    magnitude = values.abs().float().clamp(max=E2M1_MAX).nan_to_num(0.0)
    if stochastic:
        index = _stochastic_index(magnitude)
    else:
        midpoints = torch.tensor(_MIDPOINTS, device=values.device)
        below = torch.bucketize(magnitude, midpoints)  # midpoints strictly below
        tie = torch.bucketize(magnitude, midpoints, right=True) != below
        # the code above midpoints 1, 3 and 5 has an even mantissa: a tie there goes up
        index = below + (tie & (below % 2 == 1))
    return index.to(torch.uint8) | (torch.signbit(values).to(torch.uint8) << 3)


def _stochastic_index(magnitude: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_VALUES, device=magnitude.device)
    low = torch.bucketize(magnitude, grid, right=True) - 1  # the grid point at or below
    high = (low + 1).clamp(max=len(E2M1_VALUES) - 1)
    span = grid[high] - grid[low]
    share = torch.where(span > 0, (magnitude - grid[low]) / span.clamp(min=1e-30), 0.0)
    return low + (torch.rand_like(magnitude) < share).long()


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The values (float32) of 4-bit codes."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    magnitude = table[(codes & 7).long()]
    return torch.where((codes & 8).bool(), -magnitude, magnitude)


def pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dimension, the first in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_pairs(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


@dataclass
class Fp4Tensor:
    """A tensor in an FP4 format: packed codes, one scale per block, and (NVFP4) a tensor scale."""

    codes: torch.Tensor
    """uint8 [..., K / 2]: two E2M1 codes per byte."""
    scales: torch.Tensor
    """[..., K / block]: E8M0 biased exponents (uint8) for MXFP4, float8_e4m3fn for NVFP4."""
    recipe: str
    tensor_scale: torch.Tensor | None = None
    """NVFP4's fp32 tensor scale (None: the block scales alone)."""

    @property
    def shape(self) -> torch.Size:
        return torch.Size([*self.codes.shape[:-1], 2 * self.codes.shape[-1]])

    def block_scales(self) -> torch.Tensor:
        """Each block's scale as float32 (the tensor scale folded in)."""
        if self.recipe == "mxfp4":
            exponent = self.scales.float() - E8M0_BIAS
            scale = torch.exp2(exponent)
            return torch.where(self.scales == E8M0_NAN, torch.nan, scale)
        scale = self.scales.float()
        return scale * self.tensor_scale if self.tensor_scale is not None else scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        values = e2m1_values(unpack_pairs(self.codes))
        block = BLOCK_SIZE[self.recipe]
        blocks = values.unflatten(-1, (-1, block))
        return (blocks * self.block_scales().unsqueeze(-1)).flatten(-2).to(dtype)


def _blocks(values: torch.Tensor, block: int) -> torch.Tensor:
    if values.shape[-1] % block:
        raise ValueError(
            f"the last dimension ({values.shape[-1]}) is not a multiple of the {block}-element "
            "blocks: FP4 formats scale whole blocks of a row"
        )
    return values.float().unflatten(-1, (-1, block))


def _block_amax(blocks: torch.Tensor, square: bool) -> torch.Tensor:
    """Each block's largest magnitude; `square`: each square tile's (block × block elements of
    `block` rows), shared by the tile's blocks, so that the values quantise alike along either
    dimension — one copy of a weight serves both of its products, as NVFP4 training recipes
    arrange for weights."""
    amax = blocks.abs().amax(dim=-1)
    if not square:
        return amax
    block = blocks.shape[-1]
    if blocks.dim() < 3 or blocks.shape[-3] % block:
        raise ValueError(
            f"square {block} x {block} tiles need a matrix whose rows are a multiple of {block}"
        )
    tiles = amax.unflatten(-2, (-1, block)).amax(dim=-2, keepdim=True)
    return tiles.expand(*tiles.shape[:-2], block, tiles.shape[-1]).flatten(-3, -2)


@dataclass
class _Scaled:
    """Blocks divided by their scales, ready to round onto E2M1, and the scales as stored."""

    blocks: torch.Tensor
    """float32 [..., K / block, block], clamped to ±6."""
    scales: torch.Tensor
    block_scale: torch.Tensor
    """float32 [..., K / block]: each block's scale as dequantisation applies it (NaN for a
    block holding NaN or ±Inf)."""
    tensor_scale: torch.Tensor | None = None


def _scaled_mxfp4(values: torch.Tensor, square: bool) -> _Scaled:
    blocks = _blocks(values, BLOCK_SIZE["mxfp4"])
    amax = _block_amax(blocks, square)
    finite = torch.isfinite(amax)
    # floor(log2(amax)) from the float's exponent field, exactly; 0 and subnormals clamp low
    exponent_field = (amax.where(finite, 1.0).view(torch.int32) >> 23) & 0xFF
    exponent = (exponent_field - 127 - E2M1_MAX_EXPONENT).clamp(-E8M0_BIAS, E8M0_BIAS)
    biased = torch.where(finite, exponent + E8M0_BIAS, E8M0_NAN).to(torch.uint8)
    scaled = blocks * torch.exp2(-exponent.float()).unsqueeze(-1)
    block_scale = torch.exp2(exponent.float()).where(finite, torch.nan)
    return _Scaled(scaled.clamp(-E2M1_MAX, E2M1_MAX), biased, block_scale)


def _scaled_nvfp4(values: torch.Tensor, tensor_scale: bool, square: bool) -> _Scaled:
    blocks = _blocks(values, BLOCK_SIZE["nvfp4"])
    amax = _block_amax(blocks, square)
    finite = torch.isfinite(amax)
    global_scale = None
    relative = amax / E2M1_MAX
    if tensor_scale:
        largest = amax.where(finite, 0.0).amax()
        global_scale = (largest / (E2M1_MAX * E4M3_MAX)).clamp(min=torch.finfo(torch.float32).tiny)
        relative = relative / global_scale
    # clamped before the cast: torch before 2.13 does not saturate float8 casts
    stored = relative.clamp(E4M3_TINY, E4M3_MAX).where(finite, torch.nan)
    scales = stored.to(torch.float8_e4m3fn)
    block_scale = scales.float() * (global_scale if global_scale is not None else 1.0)
    scaled = blocks / block_scale.unsqueeze(-1)
    return _Scaled(scaled.clamp(-E2M1_MAX, E2M1_MAX), scales, block_scale, global_scale)


def _scaled(values: torch.Tensor, recipe: str, square: bool) -> _Scaled:
    if recipe == "mxfp4":
        return _scaled_mxfp4(values, square)
    if recipe == "nvfp4":
        return _scaled_nvfp4(values, tensor_scale=True, square=square)
    raise ValueError(f"unknown FP4 recipe {recipe!r}: nvfp4 or mxfp4")


def _packed(scaled: _Scaled, recipe: str, stochastic: bool) -> Fp4Tensor:
    codes = e2m1_codes(scaled.blocks, stochastic).flatten(-2)
    return Fp4Tensor(pack_pairs(codes), scaled.scales, recipe, scaled.tensor_scale)


def quantize_mxfp4(
    values: torch.Tensor, stochastic: bool = False, square: bool = False
) -> Fp4Tensor:
    return _packed(_scaled_mxfp4(values, square), "mxfp4", stochastic)


def quantize_nvfp4(
    values: torch.Tensor, tensor_scale: bool = True, stochastic: bool = False, square: bool = False
) -> Fp4Tensor:
    return _packed(_scaled_nvfp4(values, tensor_scale, square), "nvfp4", stochastic)


def e2m1_round(values: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
    """`values` (float32, within ±6) rounded onto the E2M1 grid as `e2m1_codes` rounds them,
    computed directly: the grid's step is 0.5 below 2, 1 below 4 and 2 up to 6, so rounding is
    `round` (ties to even) on the value over its step — exact, as the steps are powers of two.
    Stochastic rounding draws the same random numbers as `e2m1_codes` does."""
    magnitude = values.abs().nan_to_num(0.0)
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    if stochastic:
        lower = torch.floor(magnitude / step) * step
        share = (magnitude - lower) / step
        rounded = lower + step * (torch.rand_like(magnitude) < share)
    else:
        rounded = torch.round(magnitude / step) * step
    return torch.copysign(rounded, values)


def fake_quantize(
    values: torch.Tensor, recipe: str, stochastic: bool = False, square: bool = False
) -> torch.Tensor:
    """`values` quantised to the FP4 recipe and dequantised again, in their dtype: what
    `quantize_fp4(...).dequantize()` gives, bit for bit, without codes packed and unpacked."""
    scaled = _scaled(values, recipe, square)
    rounded = e2m1_round(scaled.blocks, stochastic) * scaled.block_scale.unsqueeze(-1)
    return rounded.flatten(-2).to(values.dtype)


def quantize_fp4(
    values: torch.Tensor, recipe: str, stochastic: bool = False, square: bool = False
) -> Fp4Tensor:
    """`values` in `recipe` (`nvfp4` or `mxfp4`, as `precision.fp4_recipe` names them)."""
    return _packed(_scaled(values, recipe, square), recipe, stochastic)
