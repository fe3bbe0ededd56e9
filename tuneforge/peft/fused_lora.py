"""A LoRA linear in two GEMMs that accumulate into the base's output: y = x·Wᵀ, then
y += s·(x·Aᵀ)·Bᵀ in place (cuBLAS with beta = 1), and in backward dx = g·W, then
dx += s·(g·B)·A the same way. No full-width update tensor is written, added and freed, and
backward needs only x and the rank-r x·Aᵀ.

Used by `LoRALinear` when the base is frozen, there is no dropout and the adapter computes in
the activations' dtype; `LoRALinear`'s plain expression is the reference path it is tested
against."""

import torch


class FusedLoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, lora_B, scaling: float):
        rows = x.reshape(-1, x.shape[-1])
        A, B = lora_A.to(x.dtype), lora_B.to(x.dtype)
        u = rows @ A.t()
        y = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        y.addmm_(u, B.t(), alpha=scaling)
        ctx.save_for_backward(rows, u, weight, A, B)
        ctx.scaling = scaling
        ctx.adapter_dtype = lora_A.dtype
        ctx.input_shape = x.shape
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        rows, u, weight, A, B = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gu = (g @ B).mul_(ctx.scaling)
        dx = g @ weight
        dx.addmm_(gu, A)
        dA = (gu.t() @ rows).to(ctx.adapter_dtype)
        dB = (g.t() @ u).mul_(ctx.scaling).to(ctx.adapter_dtype)
        return dx.view(ctx.input_shape), None, None, dA, dB, None
