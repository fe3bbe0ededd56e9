"""ORPO, the objective added through the objective seam: its odds-ratio term against the
paper's formula (Hong et al. 2024, eq. 6-7: the odds of a reply are P/(1-P), P its mean per-token
probability) and TRL's `odds_ratio_loss`, and the objective on packed pairs against a
straightforward computation (each reply through the model alone, with its full logits). The
whole loss against TRL's trainer code is in test_preference_against_trl.py."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import adapted_tiny_model, pair_store, reply_logps
from tuneforge.data.packing import IGNORE_INDEX, collate_from
from tuneforge.train.objectives.orpo import OrpoObjective, orpo_terms
from tuneforge.train.objectives.pairs import PairLogps


def paper_odds_ratio_loss(mean_chosen: float, mean_rejected: float, lam: float) -> float:
    """λ·L_OR for one pair, in float64 from the paper's definitions."""
    p_w, p_l = torch.tensor(mean_chosen).double().exp(), torch.tensor(mean_rejected).double().exp()
    odds_w, odds_l = p_w / (1 - p_w), p_l / (1 - p_l)
    return float(-lam * torch.log(torch.sigmoid(torch.log(odds_w / odds_l))))


def trl_odds_ratio(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, beta: float):
    """TRL's `ORPOTrainer.odds_ratio_loss` (its `losses`, `log_odds`), on mean log-probabilities."""
    log_odds = (chosen_logps - rejected_logps) - (
        torch.log1p(-torch.exp(chosen_logps)) - torch.log1p(-torch.exp(rejected_logps))
    )
    return beta * F.logsigmoid(log_odds), log_odds


def test_the_loss_is_the_papers_and_the_odds_ratio_term_trls():
    generator = torch.Generator().manual_seed(0)
    tokens_c = torch.tensor([3.0, 7.0, 1.0, 12.0])
    tokens_r = torch.tensor([5.0, 2.0, 9.0, 4.0])
    # mean log-probabilities from near 0 (likely replies) to far below
    chosen = -torch.rand(4, generator=generator) * torch.tensor([0.05, 1.0, 3.0, 8.0]) * tokens_c
    rejected = -torch.rand(4, generator=generator) * torch.tensor([2.0, 0.1, 5.0, 1.0]) * tokens_r
    terms = orpo_terms(PairLogps(chosen, rejected, tokens_c, tokens_r), beta=0.25)
    for pair in range(4):
        expected = paper_odds_ratio_loss(
            float(chosen[pair] / tokens_c[pair]), float(rejected[pair] / tokens_r[pair]), 0.25
        )
        assert terms["loss"][pair].item() == pytest.approx(expected, rel=1e-5)
        assert terms["nll"][pair] == pytest.approx(-chosen[pair] / tokens_c[pair])
    trl_losses, trl_log_odds = trl_odds_ratio(chosen / tokens_c, rejected / tokens_r, 0.25)
    assert torch.allclose(0.25 * terms["log_odds_ratio"], trl_losses, rtol=1e-5)
    assert torch.allclose(terms["log_odds"], trl_log_odds, rtol=1e-5)
    # a reply the model is sure of (mean log-probability 0) stays finite
    sure = orpo_terms(PairLogps(torch.zeros(1), -torch.ones(1), torch.ones(1), torch.ones(1)), 0.1)
    assert torch.isfinite(sure["loss"]).all()


def test_packed_pairs_give_the_straightforward_loss_and_gradients():
    store = pair_store(3)
    policy = adapted_tiny_model(trained=True)
    objective = OrpoObjective(policy, beta=0.3)
    batch = collate_from(store, list(range(6)))
    packed = objective(batch)
    assert objective.units(batch) == 3
    chosen_tokens = objective.token_units(batch)
    (packed.loss_sum / 3 + packed.token_loss_sum / chosen_tokens).backward()
    packed_grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad()
    odds_term, nll_sum, tokens = torch.zeros(()), torch.zeros(()), 0
    for pair in range(3):
        chosen, rejected = store[2 * pair], store[2 * pair + 1]
        nc = sum(label != IGNORE_INDEX for label in chosen.labels)
        nr = sum(label != IGNORE_INDEX for label in rejected.labels)
        sum_c = reply_logps(policy, chosen.input_ids, chosen.labels)
        mean_c = sum_c / nc
        mean_r = reply_logps(policy, rejected.input_ids, rejected.labels) / nr
        odds_ratio = (mean_c.exp() / (1 - mean_c.exp())) / (mean_r.exp() / (1 - mean_r.exp()))
        odds_term = odds_term - 0.3 * torch.log(torch.sigmoid(torch.log(odds_ratio)))
        nll_sum, tokens = nll_sum - sum_c, tokens + nc
    # the NLL per token over all chosen tokens, the odds-ratio term per pair
    (odds_term / 3 + nll_sum / tokens).backward()
    assert int(chosen_tokens) == tokens
    assert packed.loss_sum.item() == pytest.approx(odds_term.item(), rel=1e-4)
    assert packed.token_loss_sum.item() == pytest.approx(nll_sum.item(), rel=1e-4)
    assert packed_grads and all(grad.abs().sum() > 0 for grad in packed_grads.values())
    for name, grad in policy.named_parameters():
        if grad.grad is not None:
            assert torch.allclose(packed_grads[name], grad.grad, rtol=1e-3, atol=1e-5), name
    assert packed.metrics["nll_loss"].item() == pytest.approx(
        float(-sum(reply_logps(policy, store[2 * p].input_ids, store[2 * p].labels)
                   / sum(label != IGNORE_INDEX for label in store[2 * p].labels)
                   for p in range(3))), rel=1e-4,
    )  # fmt: skip
