"""Causal attention over packed documents through FlashAttention-4's CuTe kernels (the
`flash-attn-4` package), which use Hopper's and Blackwell's own instructions (wgmma, TMA)
where the flash kernels PyTorch ships do not (bench/RESULTS.md has the two side by side).

The kernels are wrapped as two operators with known output shapes, so a compiled block treats
each as one opaque call, and an autograd function pairs the forward with its backward. The package is
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


OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define(
    "flash4_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, int max_seqlen) "
    "-> (Tensor, Tensor)"
)
OPERATORS.define(
    "flash4_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "Tensor cu_seqlens, int max_seqlen) -> (Tensor, Tensor, Tensor)"
)


def _forward(
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


def _backward(
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


# Registered through the dispatcher directly rather than `torch.library.custom_op`, whose
# Python wrappers cost tens of microseconds per call; autograd pairs them in `Flash4Attention`.
OPERATORS.impl("flash4_forward", _forward, "CompositeExplicitAutograd")
OPERATORS.impl("flash4_backward", _backward, "CompositeExplicitAutograd")


@torch.library.register_fake("tuneforge::flash4_forward")
def _(q, k, v, cu_seqlens, max_seqlen):
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    return out, q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


@torch.library.register_fake("tuneforge::flash4_backward")
def _(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


flash4_forward = torch.ops.tuneforge.flash4_forward.default
flash4_backward = torch.ops.tuneforge.flash4_backward.default


class Flash4Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        out, lse = flash4_forward(q, k, v, cu_seqlens, max_seqlen)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
        ctx.max_seqlen = max_seqlen
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
        dq, dk, dv = flash4_backward(grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen)
        return dq, dk, dv, None, None
