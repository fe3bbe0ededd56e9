"""AdamW with decay only on matrices (over fp32 masters of 16-bit weights where the run keeps
them), and the learning-rate schedule as a pure function of the step."""

import math

import torch
from torch import nn

from tuneforge.config.sections.train import TrainSection
from tuneforge.precision.trained_weights import LOW_PRECISION, TrainedWeights
from tuneforge.train.master_adamw import MasterAdamW


def build_optimizer(
    model: nn.Module,
    train: TrainSection,
    device: torch.device,
    weights: TrainedWeights | None = None,
) -> torch.optim.Optimizer:
    """`weights`: what the run keeps of its trained 16-bit weights (None: nothing beside them)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            # Norm weights and biases are vectors: weight decay would only pull them to zero.
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [group for group in groups if group["params"]]
    update = weights.optimizer_update if weights is not None else None
    if update is not None and any(p.dtype in LOW_PRECISION for p in decay + no_decay):
        return MasterAdamW(
            groups,
            lr=train.lr,
            betas=train.betas,
            eps=train.eps,
            weight_decay=train.weight_decay,
            update=update,
        )
    return torch.optim.AdamW(
        groups,
        lr=train.lr,
        betas=train.betas,
        eps=train.eps,
        fused=True,  # CPU too: one path everywhere, and it skips non-finite updates itself
    )


def learning_rate(step: int, total_steps: int, train: TrainSection) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then the decay."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.schedule == "constant":
        return train.lr
    decay_steps = max(total_steps - train.warmup_steps, 1)
    progress = min((step - train.warmup_steps) / decay_steps, 1.0)
    if train.schedule == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return train.min_lr + (train.lr - train.min_lr) * factor
