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


def group_advantages(
    rewards: torch.Tensor, group: int, scale: str, batch_spread: torch.Tensor | None = None
) -> Advantages:
    """`rewards` [completions], a group's `group` completions one after another;
    `batch_spread`: the step's standard deviation of rewards where it spans more than these
    (every rank's), for `scale` batch."""
    grouped = rewards.view(-1, group)
    mean = grouped.mean(dim=1)
    std = grouped.std(dim=1) if group > 1 else torch.zeros_like(mean)
    values = rewards - mean.repeat_interleave(group)
    if scale == "group":
        values = values / (std.repeat_interleave(group) + STD_FLOOR)
    elif scale == "batch":
        spread = batch_spread if batch_spread is not None else rewards.std()
        values = values / (spread + STD_FLOOR)
    zero = torch.isclose(std, torch.zeros_like(std))
    return Advantages(values, std, zero)


def spread_across_ranks(rewards: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The standard deviation (Bessel-corrected) of every rank's rewards together."""
    stats = torch.tensor(
        [float(rewards.sum()), float((rewards.double() ** 2).sum()), float(rewards.numel())],
        dtype=torch.float64,
        device=device,
    )
    torch.distributed.all_reduce(stats)
    total, squares, count = stats.tolist()
    variance = (squares - total * total / count) / max(count - 1, 1)
    return torch.tensor(max(variance, 0.0) ** 0.5, dtype=rewards.dtype)
