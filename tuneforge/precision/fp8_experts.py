"""A frozen expert bank's projection in FP8: each expert's weight [out, in] quantised once, the
rows (sorted by expert) quantised per token, and one grouped FP8 product each way through
`torch._scaled_grouped_mm` (Hopper, Blackwell's sm100, MI300 and later). That kernel takes E4M3
operands with per-row scales only, so a `hybrid` recipe's gradients stay E4M3 here and
`tensorwise` scaling is a per-row scaling whose rows share one scale.

As for a dense linear (`fp8_product.py`), the input gradient's product reduces along `out`: it
reads a transposed copy of the FP8 weight made for it and freed after it, with the weight's
per-channel scales folded into the output gradient, (g·s_W[e])·W_q[e] for a row of expert e.
Off CUDA (tests) the product of the dequantised operands, per expert, stands in for the kernel."""

import torch
from torch import nn

from tuneforge.hardware.gpus import gfx_target
from tuneforge.precision.fp8 import E4M3, quantize


def grouped_fp8_here(device: torch.device) -> bool:
    """Whether `torch._scaled_grouped_mm` runs on `device`: NVIDIA sm90 and sm100, AMD MI300+."""
    if device.type != "cuda":
        return False
    if torch.version.hip:
        return gfx_target(device) in ("gfx942", "gfx950")
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


def _quantize_rows(
    values: torch.Tensor, rowwise: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`dtype` values and one fp32 scale per row (shared by all rows unless `rowwise`)."""
    quantized, scale = quantize(values, dtype, rowwise)
    return quantized, scale.reshape(-1).expand(values.shape[0]).contiguous()


def _scaled_grouped_mm(left, right, left_scale, right_scale, offsets, out_dtype):
    """left [M, K] rows sorted by group, right [G, K, N] with K contiguous, scales [M] and
    [G, N]: each group's rows times its matrix, in `out_dtype`."""
    if left.is_cuda:
        return torch._scaled_grouped_mm(
            left,
            right,
            left_scale,
            right_scale,
            offs=offsets,
            out_dtype=out_dtype,
            use_fast_accum=True,
        )
    # elsewhere the product of the dequantised operands, one expert at a time
    starts = [0, *offsets.tolist()]
    pieces = [
        (left[starts[g] : starts[g + 1]].float() * left_scale[starts[g] : starts[g + 1], None])
        @ (right[g].float() * right_scale[g][None])
        for g in range(right.shape[0])
    ]
    return torch.cat(pieces).to(out_dtype)


class Fp8GroupedProduct(torch.autograd.Function):
    """`rows` [M, in] sorted by expert; `weight` [E, out, in] E4M3 and `scale` [E, out]; the
    rows quantised to the weight's format."""

    @staticmethod
    def forward(ctx, rows, weight, scale, offsets, rowwise: bool):
        flat = rows.reshape(-1, rows.shape[-1])
        quantized, row_scale = _quantize_rows(flat, rowwise, weight.dtype)
        ctx.save_for_backward(weight, scale, offsets)
        ctx.rowwise = rowwise
        return _scaled_grouped_mm(
            quantized, weight.transpose(-2, -1), row_scale, scale, offsets, rows.dtype
        )

    @staticmethod
    def backward(ctx, grad):
        weight, scale, offsets = ctx.saved_tensors
        rows = torch.arange(grad.shape[0], device=grad.device, dtype=offsets.dtype)
        expert_of_row = torch.searchsorted(offsets, rows, right=True)
        folded = grad.float() * scale[expert_of_row]
        quantized, row_scale = _quantize_rows(folded, ctx.rowwise, weight.dtype)
        transposed = weight.transpose(-2, -1).contiguous()  # [E, in, out]: out contiguous
        ones = scale.new_ones(weight.shape[0], weight.shape[2])
        dx = _scaled_grouped_mm(
            quantized, transposed.transpose(-2, -1), row_scale, ones, offsets, grad.dtype
        )
        return dx, None, None, None, None


class Fp8ExpertWeights(nn.Module):
    """One projection of a frozen expert bank (`ExpertBank.low_precision[projection]`), its
    weight [E, out, in] held in FP8 with per-output-channel scales (one scale where
    `rowwise` is off), as E4M3 (`dtype`: MI300's FNUZ E4M3 there). The buffers are not saved:
    checkpoints hold what trains."""

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, rowwise: bool, dtype: torch.dtype = E4M3) -> None:
        super().__init__()
        self.rowwise = rowwise
        with torch.no_grad():
            quantized, scale = quantize(weight, dtype, rowwise)
        scale = scale.reshape(weight.shape[0], -1) if rowwise else scale.reshape(1, 1)
        self.register_buffer("weight_fp8", quantized, persistent=False)
        self.register_buffer("weight_scale", scale, persistent=False)

    def _scales(self) -> torch.Tensor:
        """[E, out], as the grouped kernel takes them (one value repeated where tensorwise)."""
        shape = self.weight_fp8.shape[:2]
        return self.weight_scale if self.rowwise else self.weight_scale.expand(shape).contiguous()

    def grouped(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return Fp8GroupedProduct.apply(rows, self.weight_fp8, self._scales(), offsets, self.rowwise)

    def single(self, rows: torch.Tensor, expert: int) -> torch.Tensor:
        """Rows that all go to `expert` (`implementation: loop`): the same product, one group."""
        offsets = torch.tensor([rows.shape[0]], device=rows.device, dtype=torch.int32)
        pick = slice(expert, expert + 1)
        return Fp8GroupedProduct.apply(
            rows, self.weight_fp8[pick], self._scales()[pick], offsets, self.rowwise
        )

    def weight_bytes(self) -> int:
        return self.weight_fp8.numel() + 4 * self.weight_scale.numel()
