"""Each completion's advantage: its reward minus its group's mean (the group: the completions of
one prompt), divided by the group's standard deviation, the batch's, or nothing (Dr. GRPO), as
TRL's GRPOTrainer makes it (Bessel-corrected deviations, 1e-4 beside them)."""

from typing import NamedTuple

import torch

STD_FLOOR = 1e-4


class Advantages(NamedTuple):
    values: torch.Tensor
    """[completions]"""
    group_std: torch.Tensor
    """[groups]: each group's standard deviation of rewards."""
    zero_std: torch.Tensor
    """[groups] bool: the group's completions were rewarded alike (nothing to learn from it)."""


def group_advantages(rewards: torch.Tensor, group: int, scale: str) -> Advantages:
    """`rewards` [completions], a group's `group` completions one after another."""
    grouped = rewards.view(-1, group)
    mean = grouped.mean(dim=1)
    std = grouped.std(dim=1) if group > 1 else torch.zeros_like(mean)
    values = rewards - mean.repeat_interleave(group)
    if scale == "group":
        values = values / (std.repeat_interleave(group) + STD_FLOOR)
    elif scale == "batch":
        spread = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        values = values / (spread + STD_FLOOR)
    zero = torch.isclose(std, torch.zeros_like(std))
    return Advantages(values, std, zero)
