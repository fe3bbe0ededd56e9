"""Causal attention over packed documents through FlashAttention-4's CuTe kernels (the
`flash-attn-4` package), which use Hopper's and Blackwell's own instructions (wgmma, TMA)
where the flash kernels PyTorch ships do not (bench/RESULTS.md has the two side by side).

The kernels are wrapped as two custom operators, so a compiled block treats them as one opaque
call with known output shapes, and autograd pairs the forward with its backward. The package is
optional: `available()` says whether it imports and the GPU is one it supports (SM 9.x, 10.x)."""

import functools
import importlib.util

import torch

PACKAGE = "flash_attn.cute.interface"
SUPPORTED_MAJORS = (9, 10)


@functools.cache
def _interface():
    return importlib.import_module(PACKAGE)


def supports(head_dim: int, device: torch.device) -> bool:
    """Head sizes the kernels take: multiples of 8, up to 256 on Hopper, up to 128 (or 256) on
    Blackwell."""
    major = torch.cuda.get_device_capability(device)[0]
    largest = 256 if major == 9 else 128
    return head_dim % 8 == 0 and (8 <= head_dim <= largest or head_dim == 256)


def available(device: torch.device) -> bool:
    if device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        return False
    if torch.cuda.get_device_capability(device)[0] not in SUPPORTED_MAJORS:
        return False
    try:
        _interface()
    except Exception:  # a broken install is the same as none: fall back
        return False
    return True


@torch.library.custom_op("tuneforge::flash4_forward", mutates_args=())
def flash4_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [T, H, D] and the softmax's log-sum-exp [H, T] (fp32) for the backward."""
    out, lse = _interface()._flash_attn_fwd(
        q, k, v,
        cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
        causal=True, return_lse=True,
    )[:2]  # fmt: skip
    return out, lse


@flash4_forward.register_fake
def _(q, k, v, cu_seqlens, max_seqlen):
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    return out, q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


@torch.library.custom_op("tuneforge::flash4_backward", mutates_args=())
def flash4_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _interface()._flash_attn_bwd(
        q, k, v, out, grad_out.contiguous(), lse,
        causal=True,
        cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
        deterministic=torch.are_deterministic_algorithms_enabled(),
    )[:3]  # fmt: skip
    return dq, dk, dv


@flash4_backward.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_seqlen = max_seqlen


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = flash4_backward(grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen)
    return dq, dk, dv, None, None


flash4_forward.register_autograd(_backward, setup_context=_setup_context)
