"""Each completion's advantage: its reward minus its group's mean (the group: the completions of
one prompt), divided by the group's standard deviation, the batch's, or nothing (Dr. GRPO), as
TRL's GRPOTrainer makes it (Bessel-corrected deviations, 1e-4 beside them). A completion that no
reward function scored (reward NaN) is left out of every mean and deviation, and its advantage
is 0, as is every advantage whose deviation is undefined (fewer than two scored)."""

import math
from typing import NamedTuple

import torch

STD_FLOOR = 1e-4


class Advantages(NamedTuple):
    values: torch.Tensor
    """[completions]"""
    group_std: torch.Tensor
    """[groups]: each group's standard deviation of rewards (NaN with fewer than two scored)."""
    zero_std: torch.Tensor
    """[groups] bool: the group's completions were rewarded alike, or fewer than two were
    scored (nothing to learn from it)."""
    unscored: torch.Tensor
    """0-d: completions that no reward function scored."""


def nan_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The Bessel-corrected standard deviation of the values that are not NaN; NaN where fewer
    than two are."""
    count = (~values.isnan()).sum(dim=dim)
    mean = values.nanmean(dim=dim, keepdim=True)
    variance = ((values - mean) ** 2).nansum(dim=dim) / (count - 1).clamp(min=1)
    return variance.sqrt().masked_fill(count < 2, math.nan)


def group_advantages(rewards: torch.Tensor, group: int, scale: str) -> Advantages:
    """`rewards` [completions], a group's `group` completions one after another, NaN where no
    function scored; `scale` batch divides by these rewards' deviation (the GRPO objective
    centres each micro-batch's with `none`, then divides by the whole step's)."""
    grouped = rewards.view(-1, group)
    mean = grouped.nanmean(dim=1)
    std = nan_std(grouped, dim=1) if group > 1 else torch.full_like(mean, math.nan)
    values = rewards - mean.repeat_interleave(group)
    if scale == "group":
        values = values / (std.repeat_interleave(group) + STD_FLOOR)
    elif scale == "batch":
        values = values / (nan_std(rewards) + STD_FLOOR)
    zero = torch.isclose(std, torch.zeros_like(std)) | std.isnan()
    unscored = rewards.isnan().sum()
    return Advantages(torch.nan_to_num(values, nan=0.0), std, zero, unscored)


def spread_across_ranks(rewards: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The standard deviation (Bessel-corrected) of every rank's scored rewards together."""
    scored = rewards[~rewards.isnan()].double()
    stats = torch.tensor(
        [float(scored.sum()), float((scored**2).sum()), float(scored.numel())],
        dtype=torch.float64,
        device=device,
    )
    torch.distributed.all_reduce(stats)
    total, squares, count = stats.tolist()
    if count < 2:
        return torch.tensor(math.nan, dtype=rewards.dtype)
    variance = (squares - total * total / count) / (count - 1)
    return torch.tensor(max(variance, 0.0) ** 0.5, dtype=rewards.dtype)
