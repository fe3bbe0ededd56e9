"""A LoRA linear whose update is accumulated by the GEMM that makes it: y = x·Wᵀ, then
y + s·(x·Aᵀ)·Bᵀ as one addmm (cuBLAS with beta = 1), and in backward dx = g·W + s·(g·B)·A the
same way. No full-width update tensor is written, then added, and backward needs only x and
the rank-r x·Aᵀ. (Out of place: under torch.compile an in-place addmm_ on an intermediate is
functionalised into an extra device-to-device copy — 448 copies, 10 ms, per Llama-3-8B step.)

Used by `LoRALinear` when the base is frozen, there is no dropout and the adapter computes in
the activations' dtype; `LoRALinear`'s plain expression is the reference path it is tested
against."""

import torch


class FusedLoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weight, bias, lora_A, lora_B, scaling: float):
        """`rows` [N, in]: 2-D, so that no output is a view (which torch.compile would copy)."""
        A, B = lora_A.to(rows.dtype), lora_B.to(rows.dtype)
        u = rows @ A.t()
        y = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        y = torch.addmm(y, u, B.t(), alpha=scaling)
        ctx.save_for_backward(rows, u, weight, A, B)
        ctx.scaling = scaling
        ctx.adapter_dtype = lora_A.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        rows, u, weight, A, B = ctx.saved_tensors
        gu = (grad @ B).mul_(ctx.scaling)
        # the first block's input comes from a frozen embedding: no gradient to make there
        dx = torch.addmm(grad @ weight, gu, A) if ctx.needs_input_grad[0] else None
        dA = (gu.t() @ rows).to(ctx.adapter_dtype)
        dB = (grad.t() @ u).mul_(ctx.scaling).to(ctx.adapter_dtype)
        return dx, None, None, dA, dB, None
