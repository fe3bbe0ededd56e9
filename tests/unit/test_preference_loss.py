"""The preference losses against their papers' formulas, on hand-computed log-probabilities:
DPO (sigmoid, with conservative DPO's label smoothing), IPO on per-token mean log-ratios, and
reference-free SimPO. Against TRL's own code: test_preference_against_trl.py."""

import math

import pytest
import torch

from tuneforge.train.objectives.pairs import PairLogps
from tuneforge.train.objectives.preference_loss import (
    PreferenceLoss,
    preference_losses,
    sft_token_loss_sum,
)


def _pair(chosen, rejected, chosen_tokens=5, rejected_tokens=4, grad=False):
    values = torch.tensor([chosen, rejected], dtype=torch.float64, requires_grad=grad)
    logps = PairLogps(
        values[:1], values[1:], torch.tensor([chosen_tokens]), torch.tensor([rejected_tokens])
    )
    return logps, values


def _softplus(x: float) -> float:  # -log σ(-x)
    return math.log1p(math.exp(x))


POLICY, REFERENCE = (-10.0, -12.0), (-11.0, -11.5)
H = (POLICY[0] - POLICY[1]) - (REFERENCE[0] - REFERENCE[1])  # 1.5


def test_dpo_is_minus_log_sigmoid_of_beta_times_the_log_ratio_margin():
    policy, values = _pair(*POLICY, grad=True)
    reference, _ = _pair(*REFERENCE)
    out = preference_losses(PreferenceLoss("sigmoid", beta=0.1), policy, reference)
    assert out.loss.item() == pytest.approx(_softplus(-0.1 * H), rel=1e-6)
    assert out.reward_chosen.item() == pytest.approx(0.1 * (POLICY[0] - REFERENCE[0]))
    assert out.reward_rejected.item() == pytest.approx(0.1 * (POLICY[1] - REFERENCE[1]))
    # the paper's gradient: -β·σ(-β·h) on log π(chosen), the opposite on log π(rejected)
    out.loss.sum().backward()
    weight = 0.1 / (1 + math.exp(0.1 * H))
    assert values.grad.tolist() == pytest.approx([-weight, weight], rel=1e-6)


def test_label_smoothing_flips_the_label_with_its_probability():
    policy, _ = _pair(*POLICY)
    reference, _ = _pair(*REFERENCE)
    out = preference_losses(PreferenceLoss("sigmoid", 0.1, label_smoothing=0.2), policy, reference)
    expected = 0.8 * _softplus(-0.1 * H) + 0.2 * _softplus(0.1 * H)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


def test_ipo_is_the_squared_distance_of_the_mean_margin_from_one_over_two_beta():
    policy, _ = _pair(*POLICY)  # 5 chosen tokens, 4 rejected
    reference, _ = _pair(*REFERENCE)
    out = preference_losses(PreferenceLoss("ipo", beta=0.1), policy, reference)
    h_mean = (POLICY[0] - REFERENCE[0]) / 5 - (POLICY[1] - REFERENCE[1]) / 4
    assert out.loss.item() == pytest.approx((h_mean - 5.0) ** 2, rel=1e-6)


def test_simpo_uses_mean_log_probabilities_and_a_target_margin_without_a_reference():
    policy, _ = _pair(-10.0, -12.0, chosen_tokens=5, rejected_tokens=4)
    out = preference_losses(PreferenceLoss("simpo", beta=2.0, simpo_gamma=0.5), policy, None)
    margin = 2.0 * (-10.0 / 5 - -12.0 / 4) - 0.5
    assert out.loss.item() == pytest.approx(_softplus(-margin), rel=1e-6)
    assert out.reward_chosen.item() == pytest.approx(2.0 * -2.0)
    assert out.reward_rejected.item() == pytest.approx(2.0 * -3.0)


def test_sft_weight_is_a_term_summed_over_the_chosen_tokens():
    policy, _ = _pair(*POLICY)
    assert sft_token_loss_sum(PreferenceLoss("sigmoid", 0.1), policy) is None
    term = sft_token_loss_sum(PreferenceLoss("sigmoid", 0.1, sft_weight=0.5), policy)
    assert term.item() == pytest.approx(0.5 * 10.0)  # the step divides by the chosen tokens


def test_before_any_update_dpo_is_ln_2_and_the_rewards_are_zero():
    logps = PairLogps(
        torch.tensor([-3.0, -40.0]), torch.tensor([-7.0, -2.5]), torch.tensor([2, 9]),
        torch.tensor([3, 1]),
    )  # fmt: skip
    out = preference_losses(PreferenceLoss("sigmoid", 0.3), logps, logps)
    assert torch.equal(out.loss, torch.full((2,), math.log(2)))
    assert not out.reward_chosen.any() and not out.reward_rejected.any()
    ipo = preference_losses(PreferenceLoss("ipo", 0.3), logps, logps)
    assert ipo.loss.tolist() == pytest.approx([(1 / 0.6) ** 2] * 2)
    with pytest.raises(ValueError, match="needs the reference"):
        preference_losses(PreferenceLoss("sigmoid"), logps, None)
    with pytest.raises(ValueError, match="one of"):
        PreferenceLoss("kto")
