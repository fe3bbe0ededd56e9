"""The LoRA part of a low-precision product, shared by the FP8 and FP4 ones: the update reads the
unquantised input in the activations' dtype, and its gradients are LoRA's own."""

import torch


def low_rank_input(rows: torch.Tensor, lora_A: torch.Tensor | None, lora_B: torch.Tensor | None):
    """(u = rows·Aᵀ, A, B) in the activations' dtype, or three Nones for the base alone."""
    if lora_A is None or lora_B is None:
        return None, None, None
    A, B = lora_A.to(rows.dtype), lora_B.to(rows.dtype)
    return rows @ A.t(), A, B


def low_rank_grads(grad, rows, u, A, B, scaling: float, dtype, input_grad):
    """dx (from `input_grad()`, the base's product, plus s·(g·B)·A), dA and dB; dx is None
    where `input_grad` is None, dA and dB for the base alone."""
    gu = None if B is None else grad @ B
    dx = None if input_grad is None else input_grad()
    if dx is not None and gu is not None:
        dx.addmm_(gu, A, alpha=scaling)
    if gu is None:
        return dx, None, None
    dA = (gu.t() @ rows).mul_(scaling).to(dtype)
    dB = (grad.t() @ u).mul_(scaling).to(dtype)
    return dx, dA, dB
