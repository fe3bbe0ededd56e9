"""Preference losses on the log-probabilities of each pair's chosen and rejected replies:

- `sigmoid` (DPO, Rafailov et al. 2023): -log σ(β·h), h = (log π_c - log π_r) - (log ρ_c - log ρ_r)
  with ρ the reference; with label smoothing ε (conservative DPO) the pair's label is flipped
  with probability ε: -(1-ε)·log σ(β·h) - ε·log σ(-β·h).
- `ipo` (Azar et al. 2023): (h̄ - 1/(2β))², a squared loss that does not push h̄ to infinity,
  on the per-token mean log-ratios h̄ = (log π_c - log ρ_c)/n_c - (log π_r - log ρ_r)/n_r
  (n a reply's supervised tokens), as TRL takes it: the IPO paper's results use that mean.
- `simpo` (Meng et al. 2024): reference-free, on the replies' mean token log-probabilities:
  -log σ(β·(mean log π_c - mean log π_r) - γ), with the same label smoothing.

A reply's log-probability is the sum over its supervised tokens (the mean for SimPO and in
IPO's ratios). The rewards reported are β·(log π - log ρ) (β·mean log π for SimPO).
`sft_weight` adds the chosen replies' negative log-likelihood per token, over all the chosen
tokens of the step (`sft_token_loss_sum`: SFT's normalisation, TRL's `sft` loss term)."""

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from tuneforge.config.objectives.dpo import PREFERENCE_LOSSES, REFERENCE_FREE
from tuneforge.train.objectives.pairs import PairLogps


@dataclass(frozen=True)
class PreferenceLoss:
    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    sft_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.loss not in PREFERENCE_LOSSES:
            raise ValueError(
                f"preference loss must be one of {PREFERENCE_LOSSES}, not {self.loss!r}"
            )

    @property
    def needs_reference(self) -> bool:
        return self.loss not in REFERENCE_FREE


class PairLosses(NamedTuple):
    """Per pair [P]: the loss and the two rewards."""

    loss: torch.Tensor
    reward_chosen: torch.Tensor
    reward_rejected: torch.Tensor


def preference_losses(
    setting: PreferenceLoss, policy: PairLogps, reference: PairLogps | None
) -> PairLosses:
    """The losses and rewards of each pair, in fp32. `reference` is None only for SimPO."""
    beta = setting.beta
    chosen, rejected = policy.chosen.float(), policy.rejected.float()
    if setting.loss == "simpo":
        chosen_mean, rejected_mean = policy.chosen_mean, policy.rejected_mean
        margin = beta * (chosen_mean - rejected_mean) - setting.simpo_gamma
        loss = _smoothed_sigmoid_loss(margin, setting.label_smoothing)
        reward_chosen, reward_rejected = beta * chosen_mean, beta * rejected_mean
    else:
        if reference is None:
            raise ValueError(f"the {setting.loss} loss needs the reference's log-probabilities")
        chosen_ratio = chosen - reference.chosen.float()
        rejected_ratio = rejected - reference.rejected.float()
        if setting.loss == "ipo":
            chosen_mean_ratio = chosen_ratio / policy.chosen_tokens.clamp(min=1)
            rejected_mean_ratio = rejected_ratio / policy.rejected_tokens.clamp(min=1)
            loss = (chosen_mean_ratio - rejected_mean_ratio - 1 / (2 * beta)) ** 2
        else:
            h = chosen_ratio - rejected_ratio
            loss = _smoothed_sigmoid_loss(beta * h, setting.label_smoothing)
        reward_chosen, reward_rejected = beta * chosen_ratio, beta * rejected_ratio
    return PairLosses(loss, reward_chosen.detach(), reward_rejected.detach())


def sft_token_loss_sum(setting: PreferenceLoss, policy: PairLogps) -> torch.Tensor | None:
    """`sft_weight` times the chosen replies' negative log-likelihood summed over their tokens
    (the step divides it by the chosen tokens of all its micro-batches); None without it."""
    if not setting.sft_weight:
        return None
    return -setting.sft_weight * policy.chosen.float().sum()


def _smoothed_sigmoid_loss(margin: torch.Tensor, smoothing: float) -> torch.Tensor:
    loss = -F.logsigmoid(margin)
    if smoothing:
        loss = (1 - smoothing) * loss - smoothing * F.logsigmoid(-margin)
    return loss
