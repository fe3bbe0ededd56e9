"""ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model")
as an objective: the chosen replies' negative log-likelihood per token over all the chosen
tokens of the step, plus λ·(−log σ(log OR)) averaged over the pairs, where OR is the odds ratio
of the chosen to the rejected reply and a reply's odds are P/(1−P), P its mean per-token
probability (exp of the mean log-probability), as TRL's `ORPOTrainer` takes it. One forward of
the policy; no reference model."""

import math

import torch
import torch.nn.functional as F

from tuneforge.config.objectives.orpo import ORPO
from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.pairs import (
    REWARD_METRICS,
    PairLogps,
    chosen_tokens,
    pair_logps_of_hidden,
    reward_sums,
)
from tuneforge.train.objectives.seam import (
    Metric,
    Objective,
    ObjectiveOutput,
    hidden_states_and_aux,
)

LN_2 = math.log(2)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x < 0: log(−expm1(x)) above −ln 2, log1p(−exp(x)) below, each where
    the other cancels (Mächler 2012)."""
    x = x.clamp(max=-1e-7)
    return torch.where(x > -LN_2, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def orpo_terms(policy: PairLogps, beta: float) -> dict[str, torch.Tensor]:
    """Per pair [P], in fp32: the odds-ratio `loss` (−β·log σ(log OR)), the chosen reply's `nll`
    per token, `log_odds_ratio` (log σ(log OR)), the `log_odds` themselves and the rewards
    β·(mean log-probability). The NLL term of the loss is summed over tokens by the objective."""
    chosen, rejected = policy.chosen_mean, policy.rejected_mean
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    nll = -chosen
    return {
        "loss": -beta * ratio,
        "nll": nll,
        "log_odds_ratio": ratio,
        "log_odds": log_odds,
        "reward_chosen": beta * chosen,
        "reward_rejected": beta * rejected,
    }


class OrpoObjective(Objective):
    metrics = (
        *REWARD_METRICS,
        Metric("nll_loss"),
        Metric("log_odds_ratio"),
        Metric("log_odds_chosen"),
    )

    def __init__(self, model: Decoder, beta: float, chunk_tokens: int = 1024) -> None:
        super().__init__(model)
        self.beta = beta
        self.chunk_tokens = chunk_tokens

    def units(self, batch: PackedBatch) -> int:
        return batch.num_documents // 2

    def token_units(self, batch: PackedBatch) -> torch.Tensor:
        return chosen_tokens(batch)

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        hidden, aux = hidden_states_and_aux(self.model, batch)
        policy = pair_logps_of_hidden(hidden, self.model, batch, self.chunk_tokens)
        terms = orpo_terms(policy, self.beta)
        chosen, rejected = terms["reward_chosen"].detach(), terms["reward_rejected"].detach()
        metrics = reward_sums(chosen, rejected) | {
            "nll_loss": terms["nll"].detach().sum(),
            "log_odds_ratio": terms["log_odds_ratio"].detach().sum(),
            "log_odds_chosen": terms["log_odds"].detach().sum(),
        }
        nll_sum = -policy.chosen.float().sum()
        return ObjectiveOutput(terms["loss"].sum(), aux, metrics, nll_sum)


def build(setup: ObjectiveSetup) -> OrpoObjective:
    config = setup.config
    return OrpoObjective(setup.model, config.orpo.beta, config.train.loss_chunk_tokens)


COMPONENT = ObjectiveComponent(ORPO, build)
