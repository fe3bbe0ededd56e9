"""What the LoRA variants (`dora.py`, `decomposed_init.py`) read of an adapted linear — the
attributes `lora.LoRALinear` has — so that they need not import it (it imports them)."""

from typing import Any, Protocol

import torch
from torch import nn


class LowRankAdapter(Protocol):
    base: Any
    """The frozen linear (an `nn.Linear` for these variants)."""
    lora_A: nn.Parameter
    lora_B: nn.Parameter
    lora_magnitude: nn.Parameter | None
    initial: tuple[torch.Tensor, torch.Tensor] | None
    dropout: Any
    rank: int
    alpha: float
    scaling: float
    use_rslora: bool
    training: bool
