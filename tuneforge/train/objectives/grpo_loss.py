"""GRPO's policy loss on the completion tokens of a batch of sampled completions (Shao et al.
2024, as TRL's GRPOTrainer computes it): each token's importance ratio to the policy that
generated it, clipped PPO-style to [1 - epsilon, 1 + epsilon_high], times its completion's
advantage; plus beta times the k3 estimate of the KL divergence to the reference. The three
`loss_type`s differ in how token losses are averaged: per completion then over completions
(`grpo`), over completions × max_new_tokens (`dr_grpo`), over every completion token (`dapo`)."""

from typing import NamedTuple

import torch


class GrpoLossSetting(NamedTuple):
    loss_type: str
    epsilon: float
    epsilon_high: float
    beta: float
    max_new_tokens: int


class GrpoLoss(NamedTuple):
    loss_sum: torch.Tensor
    """0-d: summed over the loss's units (completions for grpo and dr_grpo, tokens for dapo)."""
    clipped: torch.Tensor
    """0-d: completion tokens whose ratio was clipped (the clip took the gradient away)."""
    kl: torch.Tensor
    """0-d: the per-token KL estimates summed over the completion tokens (0 without beta)."""


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion: torch.Tensor,
    setting: GrpoLossSetting,
) -> GrpoLoss:
    """`logps`, `old_logps`, `ref_logps`: [N] log-probabilities of each row's label under the
    policy (with gradient), the generating policy and the reference; `advantages`: [N] each row's
    completion's advantage; `completion`: int64 [N], the completion a row belongs to (-1: a row
    that is no completion token: prompt, padding)."""
    counted = completion >= 0
    ratio = torch.exp(logps - old_logps)
    clipped_ratio = ratio.clamp(1 - setting.epsilon, 1 + setting.epsilon_high)
    token_loss = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(logps)
    if setting.beta and ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        token_loss = token_loss + setting.beta * kl
    token_loss = token_loss * counted
    clipped = ((ratio < 1 - setting.epsilon) & (advantages < 0)) | (
        (ratio > 1 + setting.epsilon_high) & (advantages > 0)
    )
    clip_count = (clipped & counted).float().sum().detach()
    kl_sum = (kl * counted).sum().detach()
    if setting.loss_type == "grpo":
        completions = int(completion.max()) + 1 if counted.any() else 0
        index = completion.clamp(min=0)
        sums = token_loss.new_zeros(completions).index_add(0, index, token_loss)
        counts = token_loss.new_zeros(completions).index_add(0, index, counted.to(token_loss.dtype))
        loss_sum = (sums / counts.clamp(min=1)).sum()
    elif setting.loss_type == "dr_grpo":
        loss_sum = token_loss.sum() / setting.max_new_tokens
    else:
        loss_sum = token_loss.sum()
    return GrpoLoss(loss_sum, clip_count, kl_sum)


def completion_of_rows(labels_supervised: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 [N]: the document (completion) each supervised row belongs to, -1 elsewhere."""
    rows = torch.arange(labels_supervised.shape[0], device=labels_supervised.device)
    document = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)
    inside = document < cu_seqlens.numel() - 1
    return torch.where(labels_supervised & inside, document, torch.full_like(document, -1))
