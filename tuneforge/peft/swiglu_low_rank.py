"""SwiGLU over gate and up projections whose LoRA updates are added inside the activation:
h = silu(g + u_g·B_gᵀ) · (v + u_v·B_vᵀ), with g, v the frozen projections' outputs, u the
adapters' rank-r x·Aᵀ and B already scaled. The full-width updates are never written: the
rank-r products are made tile by tile in the kernel that reads g and v anyway, and backward
makes them again. Computed in fp32, rounded once.

On CUDA two Triton kernels (forward, and backward to the gradients of the gate and up
pre-activations); elsewhere, or without Triton, the same expressions in PyTorch."""

import functools

import torch
import torch.nn.functional as F

OPERATORS = torch.library.Library("tuneforge", "FRAGMENT")
OPERATORS.define(
    "swiglu_low_rank(Tensor gate, Tensor up, Tensor gate_low, Tensor up_low, Tensor gate_B, "
    "Tensor up_B) -> Tensor"
)
OPERATORS.define(
    "swiglu_low_rank_backward(Tensor grad, Tensor gate, Tensor up, Tensor gate_low, "
    "Tensor up_low, Tensor gate_B, Tensor up_B) -> (Tensor, Tensor)"
)


def _pre_activations(gate, up, gate_low, up_low, gate_B, up_B):
    g = gate.float() + gate_low.float() @ gate_B.float().t()
    v = up.float() + up_low.float() @ up_B.float().t()
    return g, v


def _swiglu_low_rank(gate, up, gate_low, up_low, gate_B, up_B):
    g, v = _pre_activations(gate, up, gate_low, up_low, gate_B, up_B)
    return (F.silu(g) * v).to(gate.dtype)


def _swiglu_low_rank_backward(grad, gate, up, gate_low, up_low, gate_B, up_B):
    g, v = _pre_activations(gate, up, gate_low, up_low, gate_B, up_B)
    sigmoid = torch.sigmoid(g)
    grad = grad.float()
    grad_up = grad * g * sigmoid
    grad_gate = grad * v * sigmoid * (1 + g * (1 - sigmoid))
    return grad_gate.to(gate.dtype), grad_up.to(gate.dtype)


@functools.cache
def _triton_kernels():
    """(forward, backward) kernels, or None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def pre_activations(
        gate, up, gate_low, up_low, gate_B, up_B, num_rows, width, low_stride, gate_rank,
        up_rank, RANK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
    ):  # fmt: skip
        rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
        ranks = tl.arange(0, RANK)
        row_ok, col_ok = rows[:, None] < num_rows, cols[:, None] < width
        mask = row_ok & (cols[None, :] < width)
        tile = rows[:, None] * width + cols[None, :]
        g = tl.load(gate + tile, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(up + tile, mask=mask, other=0.0).to(tl.float32)
        low = rows[:, None] * low_stride + ranks[None, :]
        u_g = tl.load(gate_low + low, mask=row_ok & (ranks[None, :] < gate_rank), other=0.0)
        u_v = tl.load(up_low + low, mask=row_ok & (ranks[None, :] < up_rank), other=0.0)
        b_g = tl.load(
            gate_B + cols[:, None] * gate_rank + ranks[None, :],
            mask=col_ok & (ranks[None, :] < gate_rank),
            other=0.0,
        )
        b_v = tl.load(
            up_B + cols[:, None] * up_rank + ranks[None, :],
            mask=col_ok & (ranks[None, :] < up_rank),
            other=0.0,
        )
        g += tl.dot(u_g, tl.trans(b_g))
        v += tl.dot(u_v, tl.trans(b_v))
        return g, v, tile, mask

    @triton.jit
    def forward_kernel(
        gate, up, gate_low, up_low, gate_B, up_B, out, num_rows, width, low_stride,
        gate_rank, up_rank, RANK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
    ):  # fmt: skip
        g, v, tile, mask = pre_activations(
            gate, up, gate_low, up_low, gate_B, up_B, num_rows, width, low_stride, gate_rank,
            up_rank, RANK, ROWS, COLS,
        )  # fmt: skip
        h = g * tl.sigmoid(g) * v
        tl.store(out + tile, h.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def backward_kernel(
        grad, gate, up, gate_low, up_low, gate_B, up_B, grad_gate, grad_up, num_rows, width,
        low_stride, gate_rank, up_rank, RANK: tl.constexpr, ROWS: tl.constexpr,
        COLS: tl.constexpr,
    ):  # fmt: skip
        g, v, tile, mask = pre_activations(
            gate, up, gate_low, up_low, gate_B, up_B, num_rows, width, low_stride, gate_rank,
            up_rank, RANK, ROWS, COLS,
        )  # fmt: skip
        dh = tl.load(grad + tile, mask=mask, other=0.0).to(tl.float32)
        sigmoid = tl.sigmoid(g)
        tl.store(grad_up + tile, (dh * g * sigmoid).to(grad_up.dtype.element_ty), mask=mask)
        d_gate = dh * v * sigmoid * (1 + g * (1 - sigmoid))
        tl.store(grad_gate + tile, d_gate.to(grad_gate.dtype.element_ty), mask=mask)

    return forward_kernel, backward_kernel


ROWS, COLS = 64, 128


def _launch(kernel, tensors, gate, gate_low, gate_B, up_B):
    num_rows, width = gate.shape
    rank = max(16, 1 << (max(gate_B.shape[1], up_B.shape[1]) - 1).bit_length())
    grid = (-(-num_rows // ROWS), -(-width // COLS))
    kernel[grid](
        *tensors, num_rows, width, gate_low.stride(0), gate_B.shape[1], up_B.shape[1],
        RANK=rank, ROWS=ROWS, COLS=COLS,
    )  # fmt: skip


def _usable(gate, gate_low, up_low) -> bool:
    """The kernels' layout: contiguous [T, N] outputs, rank-r inputs sharing a row stride."""
    return (
        _triton_kernels() is not None
        and gate.is_contiguous()
        and gate_low.stride(1) == 1
        and up_low.stride() == gate_low.stride()
        and gate.shape[0] > 0
    )


def _swiglu_low_rank_cuda(gate, up, gate_low, up_low, gate_B, up_B):
    if not (_usable(gate, gate_low, up_low) and up.is_contiguous()):
        return _swiglu_low_rank(gate, up, gate_low, up_low, gate_B, up_B)
    out = torch.empty_like(gate)
    low = (gate_low, up_low, gate_B.contiguous(), up_B.contiguous())
    _launch(_triton_kernels()[0], (gate, up, *low, out), gate, gate_low, gate_B, up_B)
    return out


def _swiglu_low_rank_backward_cuda(grad, gate, up, gate_low, up_low, gate_B, up_B):
    if not (_usable(gate, gate_low, up_low) and up.is_contiguous() and grad.is_contiguous()):
        return _swiglu_low_rank_backward(grad, gate, up, gate_low, up_low, gate_B, up_B)
    grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
    low = (gate_low, up_low, gate_B.contiguous(), up_B.contiguous())
    tensors = (grad, gate, up, *low, grad_gate, grad_up)
    _launch(_triton_kernels()[1], tensors, gate, gate_low, gate_B, up_B)
    return grad_gate, grad_up


OPERATORS.impl("swiglu_low_rank", _swiglu_low_rank, "CompositeExplicitAutograd")
OPERATORS.impl("swiglu_low_rank", _swiglu_low_rank_cuda, "CUDA")
OPERATORS.impl("swiglu_low_rank_backward", _swiglu_low_rank_backward, "CompositeExplicitAutograd")
OPERATORS.impl("swiglu_low_rank_backward", _swiglu_low_rank_backward_cuda, "CUDA")


@torch.library.register_fake("tuneforge::swiglu_low_rank")
def _(gate, up, gate_low, up_low, gate_B, up_B):
    return torch.empty_like(gate)


@torch.library.register_fake("tuneforge::swiglu_low_rank_backward")
def _(grad, gate, up, gate_low, up_low, gate_B, up_B):
    return torch.empty_like(gate), torch.empty_like(up)


swiglu_low_rank = torch.ops.tuneforge.swiglu_low_rank.default
swiglu_low_rank_backward = torch.ops.tuneforge.swiglu_low_rank_backward.default
