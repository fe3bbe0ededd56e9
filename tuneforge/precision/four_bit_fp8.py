"""QLoRA's 4-bit base multiplied in FP8 (`model.quantize` with `precision.fp8`): each product
dequantises the codes straight into E4M3, scaled per output channel (or per tensor), and
multiplies through `torch._scaled_mm` as the FP8 base does (`fp8_product.py`). A block's largest
value is its absmax, so the scales come from the absmaxes, once. The input gradient's GEMM reads
the weight transposed, and the dequantisation writes that layout directly. Neither FP8 copy is
kept: one linear's weight at a time, 1 byte a weight instead of the bf16 path's 2.

On CUDA one Triton kernel reads the codes and absmaxes and writes E4M3; elsewhere the same
arithmetic in torch, which is also the kernel's reference."""

import functools

import torch

from tuneforge.precision.bnb_codes import FourBitLayout, absmaxes, dequantize
from tuneforge.precision.fp8 import AMAX_FLOOR, E4M3, Fp8Recipe, largest
from tuneforge.precision.fp8_product import fp8_forward, fp8_input_grad
from tuneforge.precision.low_rank import low_rank_grads


def fp8_multipliers(held: tuple, layout: FourBitLayout, rowwise: bool) -> torch.Tensor:
    """Per output channel (or one for the tensor, repeated): 448 / the largest magnitude, the
    largest of the row's (tensor's) absmaxes, in float64 as `fp8.quantize` computes it."""
    _, absmax, nested_absmax, nested_code, offset = held
    rows = layout.shape[0]
    block_absmax = absmaxes(absmax, nested_absmax, nested_code, offset, layout).reshape(rows, -1)
    amax = block_absmax.amax(dim=1) if rowwise else block_absmax.amax().expand(rows)
    return (largest(E4M3) / amax.double().clamp(min=AMAX_FLOOR)).float().contiguous()


def _dequantize_4bit_fp8(codes, absmax, values, multiplier, rows, cols, block, transposed):
    """`absmax`: each block's in fp32; `values`: the format's 16 values by code."""
    high, low = (codes.reshape(-1) >> 4).long(), (codes.reshape(-1) & 15).long()
    weight = values[torch.stack([high, low], dim=1).reshape(rows, cols)]
    weight = (weight.reshape(-1, block) * absmax.reshape(-1, 1)).reshape(rows, cols)
    limit = largest(E4M3)
    quantized = (weight * multiplier.reshape(rows, 1)).clamp(-limit, limit).to(E4M3)
    return quantized.t().contiguous() if transposed else quantized


@functools.cache
def _triton_kernel():
    """The kernel, or None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def dequantize_kernel(
        codes,
        absmax,
        values,
        multiplier,
        out,
        rows,
        cols: tl.constexpr,
        block: tl.constexpr,
        transposed: tl.constexpr,
        tile_rows: tl.constexpr,
        tile_cols: tl.constexpr,
    ):
        # a tile of whole absmax blocks: its bytes, block absmaxes and rows' multipliers each
        # read once, contiguously; the two codes of a byte split and interleaved again
        row = tl.program_id(0) * tile_rows + tl.arange(0, tile_rows)
        in_rows = row < rows
        row64 = row.to(tl.int64)
        pair = tl.program_id(1) * (tile_cols // 2) + tl.arange(0, tile_cols // 2)
        byte = tl.load(
            codes + row64[:, None] * (cols // 2) + pair[None, :], mask=in_rows[:, None], other=0
        ).to(tl.int32)
        high = tl.load(values + (byte >> 4))
        low = tl.load(values + (byte & 15))
        weight = tl.reshape(tl.join(high, low), (tile_rows, tile_cols))
        group = tl.program_id(1) * (tile_cols // block) + tl.arange(0, tile_cols // block)
        scale = tl.load(
            absmax + row64[:, None] * (cols // block) + group[None, :],
            mask=in_rows[:, None],
            other=0.0,
        )
        weight = tl.reshape(weight, (tile_rows, tile_cols // block, block)) * scale[:, :, None]
        weight = tl.reshape(weight, (tile_rows, tile_cols))
        weight = weight * tl.load(multiplier + row, mask=in_rows, other=0.0)[:, None]
        quantized = tl.clamp(weight, -448.0, 448.0).to(tl.float8e4nv)
        col = tl.program_id(1) * tile_cols + tl.arange(0, tile_cols)
        if transposed:
            target = col[:, None].to(tl.int64) * rows + row64[None, :]
            tl.store(out + target, tl.trans(quantized), mask=in_rows[None, :])
        else:
            tl.store(out + row64[:, None] * cols + col[None, :], quantized, mask=in_rows[:, None])

    return dequantize_kernel


_LIBRARIES: list[torch.library.Library] = []


def _tile_cols(cols: int, block: int) -> int:
    """The kernel's tile width: whole absmax blocks in whole rows, or 0 where they straddle."""
    return next((width for width in (128, 64) if cols % width == 0 and width % block == 0), 0)


def _define_operator():
    """The dequantisation as an operator the compiler sees through where Triton is installed
    (`triton_op`: Inductor launches the kernel itself, without a Python launch per call), an
    opaque one of plain torch otherwise."""
    kernel = _triton_kernel()
    if kernel is None:
        operators = torch.library.Library("tuneforge", "FRAGMENT")
        operators.define(
            "dequantize_4bit_fp8(Tensor codes, Tensor absmax, Tensor values, Tensor multiplier, "
            "int rows, int cols, int block, bool transposed) -> Tensor"
        )
        operators.impl("dequantize_4bit_fp8", _dequantize_4bit_fp8, "CompositeExplicitAutograd")
        torch.library.register_fake(
            "tuneforge::dequantize_4bit_fp8",
            lambda codes, absmax, values, multiplier, rows, cols, block, transposed: (
                codes.new_empty((cols, rows) if transposed else (rows, cols), dtype=E4M3)
            ),
        )
        _LIBRARIES.append(operators)  # the definition lives as long as its library
        return torch.ops.tuneforge.dequantize_4bit_fp8.default
    launch = torch.library.wrap_triton(kernel)

    @torch.library.triton_op("tuneforge::dequantize_4bit_fp8", mutates_args=())
    def operator(
        codes: torch.Tensor,
        absmax: torch.Tensor,
        values: torch.Tensor,
        multiplier: torch.Tensor,
        rows: int,
        cols: int,
        block: int,
        transposed: bool,
    ) -> torch.Tensor:
        tile_cols = _tile_cols(cols, block)
        if codes.device.type != "cuda" or tile_cols == 0:
            return _dequantize_4bit_fp8(
                codes, absmax, values, multiplier, rows, cols, block, transposed
            )
        out = codes.new_empty((cols, rows) if transposed else (rows, cols), dtype=E4M3)
        tile_rows = 64
        grid = (-(-rows // tile_rows), cols // tile_cols)
        launch[grid](
            codes, absmax, values, multiplier, out, rows, cols, block, transposed, tile_rows,
            tile_cols,
        )  # fmt: skip
        return out

    return operator


dequantize_4bit_fp8 = _define_operator()


def fp8_weight(held: tuple, layout: FourBitLayout, values, multiplier, transposed: bool):
    """The 4-bit weight as E4M3 values of `multiplier` × weight, [out, in] or [in, out];
    `values`: the format's (`code_values`)."""
    codes, absmax, nested_absmax, nested_code, offset = held
    block_absmax = absmaxes(absmax, nested_absmax, nested_code, offset, layout)
    rows, cols = layout.shape
    return dequantize_4bit_fp8(
        codes, block_absmax, values, multiplier, rows, cols, layout.block, transposed
    )


def reference_fp8_weight(held: tuple, layout: FourBitLayout, multiplier) -> torch.Tensor:
    """The same values by bitsandbytes' own dequantisation, then rounded to E4M3."""
    codes, absmax, nested_absmax, nested_code, offset = held
    weight = dequantize(codes, absmax, nested_absmax, nested_code, offset, layout, torch.float32)
    limit = largest(E4M3)
    return (weight * multiplier.reshape(-1, 1)).clamp(-limit, limit).to(E4M3)


class FourBitFp8Product(torch.autograd.Function):
    """`rows` [N, in] times the 4-bit weight in FP8 (+ bias) (+ s·(rows·Aᵀ)·Bᵀ): `held` the
    codes' tensors, `values` the format's, `multiplier` [out] from `fp8_multipliers` and
    `weight_scale` its reciprocal as `torch._scaled_mm` takes it ([1, out], or 0-d)."""

    @staticmethod
    def forward(
        ctx, rows, codes, absmax, nested_absmax, nested_code, offset, values, multiplier,
        weight_scale, layout, bias, lora_A, lora_B, scaling, recipe: Fp8Recipe,
    ):  # fmt: skip
        held = (codes, absmax, nested_absmax, nested_code, offset)
        weight = fp8_weight(held, layout, values, multiplier, transposed=False)
        rowwise = recipe.scaling == "rowwise"
        y, u, A, B = fp8_forward(
            rows, weight, weight_scale, bias, lora_A, lora_B, scaling, recipe.forward, rowwise
        )
        saved = (rows if u is not None else None, u, A, B, values, multiplier, weight_scale)
        ctx.save_for_backward(*saved, *held)
        ctx.layout, ctx.scaling, ctx.recipe = layout, scaling, recipe
        ctx.adapter_dtype = None if lora_A is None else lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, A, B, values, multiplier, weight_scale, *held = ctx.saved_tensors
        recipe = ctx.recipe

        def input_grad() -> torch.Tensor:
            columns = fp8_weight(tuple(held), ctx.layout, values, multiplier, True).t()
            rowwise = recipe.scaling == "rowwise"
            return fp8_input_grad(grad, columns, weight_scale, recipe.backward, rowwise)

        dx, dA, dB = low_rank_grads(
            grad, rows, u, A, B, ctx.scaling, ctx.adapter_dtype,
            input_grad if ctx.needs_input_grad[0] else None,
        )  # fmt: skip
        return dx, *(None,) * 10, dA, dB, None, None
