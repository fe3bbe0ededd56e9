"""Adapters initialised from the base weight itself, as PEFT defines them — `pissa` (Meng et al.
2024: A and B from the r largest singular values and vectors of W) and `olora` (Büyükakyüz 2024:
from the first r columns of W's QR decomposition) — with s·B₀·A₀ taken out of the frozen base,
so the model starts where it was and training moves the principal part of W.

The base then holds the residual W − s·B₀·A₀. An adapter made this way is saved as the
equivalent plain LoRA on the *original* base, as PEFT's `path_initial_model_for_weight_conversion`
does: ΔW = s·(B·A − B₀·A₀) = s′·[B | −B₀]·[A ; A₀], rank 2r, alpha doubled (× √2 with rsLoRA) to
keep the scale; PEFT and `export merge` then apply it to the model as it was loaded."""

import math
from collections.abc import Callable

import torch

from tuneforge.peft.low_rank_adapter import LowRankAdapter

METHODS = ("pissa", "olora")


@torch.no_grad()
def decompose_into(adapter: LowRankAdapter, method: str) -> None:
    """Set A and B from the base weight by `method` and leave the residual in the base; keep
    A₀ and B₀ (`adapter.initial`) for saving."""
    weight = adapter.base.weight
    assert isinstance(weight, torch.Tensor)
    full = weight.float()
    rank, scaling = adapter.rank, adapter.scaling
    if method == "pissa":
        left, values, right = torch.linalg.svd(full, full_matrices=False)
        root = (values[:rank] / scaling).sqrt()
        lora_A, lora_B = root[:, None] * right[:rank], left[:, :rank] * root[None]
    elif method == "olora":
        q, r = torch.linalg.qr(full)
        lora_A, lora_B = r[:rank], q[:, :rank]
    else:
        raise ValueError(f"unknown decomposed init {method!r}: use one of {METHODS}")
    adapter.lora_A.copy_(lora_A)
    adapter.lora_B.copy_(lora_B)
    weight.copy_((full - scaling * lora_B @ lora_A).to(weight.dtype))
    adapter.initial = (adapter.lora_A.detach().clone(), adapter.lora_B.detach().clone())


def saved_rank_and_alpha(adapter: LowRankAdapter) -> tuple[int, float]:
    """The rank and alpha an adapter is saved with: doubled for a decomposed one (its update
    against the original base has rank 2r; alpha keeps the scale)."""
    if adapter.initial is None:
        return adapter.rank, adapter.alpha
    factor = math.sqrt(2) if adapter.use_rslora else 2.0
    return 2 * adapter.rank, adapter.alpha * factor


def against_original_base(
    adapter: LowRankAdapter, gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of the adapter's update against the original base: [A ; A₀] and [B | −B₀] for a
    decomposed adapter, A and B otherwise (`gather`: whole tensors from FSDP2's shards)."""
    lora_A, lora_B = gather(adapter.lora_A.detach()), gather(adapter.lora_B.detach())
    if adapter.initial is None:
        return lora_A, lora_B
    initial_A, initial_B = adapter.initial
    return torch.cat([lora_A, initial_A.to(lora_A)]), torch.cat([lora_B, -initial_B.to(lora_B)], 1)
