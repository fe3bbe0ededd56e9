"""RMSNorm as Llama and Qwen define it — normalise in fp32, cast back, then scale by the weight —
and as Gemma does (scale by 1 + weight in fp32, then cast) —
with a backward that keeps the input in its own dtype and the fp32 reciprocal RMS per row,
instead of autograd's fp32 copy of the input (and the normalised copy for the weight's
gradient): half the bytes per norm in a bf16 model. `reference_rms_norm` is the same
expression left to autograd, which the tests compare it with."""

import torch
import torch.nn.functional as F
from torch import nn


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def reference_offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's: scaled by 1 + weight in fp32, then cast."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float, offset: bool = False):
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset = offset
        if offset:
            return (x32 * rstd * (1.0 + weight.float())).to(x.dtype)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        grad_weight = None
        if ctx.needs_input_grad[1]:
            product = grad.float() * normed if ctx.offset else grad * normed.to(x.dtype)
            # summed over every leading dimension, not reshaped to rows: a DTensor sharded on
            # its sequence (a per-head norm under tensor parallelism) cannot be on torch 2.11
            leading = tuple(range(product.ndim - 1))
            grad_weight = product.sum(leading).to(weight.dtype)
        if ctx.offset:
            grad_normed = grad.float() * (1.0 + weight.float())
        else:
            grad_normed = (grad * weight).float()
        # d/dx of x·rstd(x): rstd · (g − n · mean(g · n))
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return RMSNormFunction.apply(x, self.weight, self.eps)
        return reference_rms_norm(x, self.weight, self.eps)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: normalised and scaled by 1 + weight in fp32, then cast (the weight
    starts at zero), with the same lean backward."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return RMSNormFunction.apply(x, self.weight, self.eps, True)
        return reference_offset_rms_norm(x, self.weight, self.eps)


def rms_norm(dim: int, eps: float, offset: bool) -> nn.Module:
    return OffsetRMSNorm(dim, eps) if offset else RMSNorm(dim, eps)
