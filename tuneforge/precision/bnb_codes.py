"""bitsandbytes' 4-bit layout, as its operators take it: a weight [out, in] flattened row by row,
two codes a byte (the first in the high nibble), one absmax per block of 64 codes, the absmaxes
themselves quantised to 8 bits in blocks of 256 with double quantisation (plus an offset). A
weight is its code's value in the format's table times its block's absmax."""

from dataclasses import dataclass

import torch

BLOCK = 64
"""Weights per absmax: bitsandbytes' and QLoRA's default."""
NESTED_BLOCK = 256
"""Absmaxes per block of their own 8-bit quantisation (double quantisation)."""


@dataclass(frozen=True)
class FourBitLayout:
    """What the codes' tensors do not say: bitsandbytes' block sizes, format and weight shape."""

    block: int
    quant_type: str
    shape: tuple[int, int]
    nested_block: int = 0
    """With double quantisation: absmaxes per 8-bit absmax block (0 without)."""


def absmaxes(absmax, nested_absmax, nested_code, offset, layout: FourBitLayout) -> torch.Tensor:
    """Each block's absmax in fp32 (undoing the double quantisation)."""
    if nested_absmax is None:
        return absmax
    ops = torch.ops.bitsandbytes
    nested = ops.dequantize_blockwise(
        absmax, nested_absmax, nested_code, layout.nested_block, torch.float32
    )
    return nested + offset


def dequantize(codes, absmax, nested_absmax, nested_code, offset, layout, dtype) -> torch.Tensor:
    """The weight [out, in] in `dtype`, through bitsandbytes' registered operators (which the
    compiler traces: no graph break inside a compiled block)."""
    absmax = absmaxes(absmax, nested_absmax, nested_code, offset, layout)
    return torch.ops.bitsandbytes.dequantize_4bit(
        codes, absmax, layout.block, layout.quant_type, list(layout.shape), dtype
    )


def code_values(quant_type: str, device: torch.device) -> torch.Tensor:
    """The format's 16 values in fp32, by code, as bitsandbytes' kernels on `device` give them
    (its tables in Python and in its CUDA kernels differ in the last bits)."""
    codes = torch.arange(16, dtype=torch.uint8)
    packed = ((codes[0::2] << 4) | codes[1::2]).repeat(BLOCK // 16).to(device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    dequantized = torch.ops.bitsandbytes.dequantize_4bit(
        packed, ones, BLOCK, quant_type, [BLOCK], torch.float32
    )
    return dequantized.reshape(-1)[:16].contiguous()
