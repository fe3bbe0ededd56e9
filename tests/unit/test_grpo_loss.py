"""GRPO's loss and its gradient on a fixed batch of completions, log-probabilities and rewards,
against a hand-written reference of the formulas (Shao et al. 2024; Dr. GRPO, Liu et al. 2025;
DAPO, Yu et al. 2025) for each loss type, with the clipped ratio of a second iteration and the
KL term; and the group advantages against their definition."""

import math

import pytest
import torch

from tuneforge.train.objectives.grpo_advantages import group_advantages
from tuneforge.train.objectives.grpo_loss import GrpoLossSetting, completion_of_rows, grpo_loss

LENGTHS = [3, 1, 4, 2, 5, 2]  # six completions' token counts
MAX_NEW_TOKENS = 6


def reference_loss(logps, old, ref, advantages, loss_type, eps_low, eps_high, beta):
    """Loop over the completions and their tokens, as the papers write it."""
    per_completion, all_tokens = [], []
    start = 0
    for index, length in enumerate(LENGTHS):
        token_losses = []
        for t in range(start, start + length):
            ratio = math.exp(logps[t] - old[t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            a = advantages[index]
            loss = -min(ratio * a, clipped * a)
            if beta:
                d = ref[t] - logps[t]
                loss += beta * (math.exp(d) - d - 1)
            token_losses.append(loss)
        per_completion.append(token_losses)
        all_tokens += token_losses
        start += length
    if loss_type == "grpo":
        return sum(sum(x) / len(x) for x in per_completion) / len(LENGTHS)
    if loss_type == "dr_grpo":
        return sum(all_tokens) / (len(LENGTHS) * MAX_NEW_TOKENS)
    return sum(all_tokens) / len(all_tokens)


def units(loss_type: str) -> int:
    return sum(LENGTHS) if loss_type == "dapo" else len(LENGTHS)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("second_iteration", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_loss_and_its_gradient_equal_the_formulas(loss_type, second_iteration, beta):
    torch.manual_seed(0)
    tokens = sum(LENGTHS)
    base = torch.randn(tokens, dtype=torch.float64) - 2.0
    # a later iteration: the policy moved away from the one that sampled, some ratios past
    # the clip on both sides; the first: the policy is the sampler (ratio 1)
    old = base + (torch.randn(tokens, dtype=torch.float64) * 0.4 if second_iteration else 0)
    ref = base + torch.randn(tokens, dtype=torch.float64) * 0.3
    advantages = torch.tensor([1.2, -0.7, 0.3, -1.5, 0.9, 0.0], dtype=torch.float64)
    completion = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    eps_low, eps_high = 0.2, 0.28
    logps = base.clone().requires_grad_(True)
    setting = GrpoLossSetting(loss_type, eps_low, eps_high, beta, MAX_NEW_TOKENS)
    old_used = old if second_iteration else logps.detach()
    out = grpo_loss(logps, old_used, ref, advantages[completion], completion, setting)
    loss = out.loss_sum / units(loss_type)
    loss.backward()

    def as_floats(t):
        return [float(x) for x in t]

    expected = reference_loss(
        as_floats(base), as_floats(old if second_iteration else base), as_floats(ref),
        as_floats(advantages), loss_type, eps_low, eps_high, beta,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12, abs=1e-14)
    # the gradient by central differences of the reference, token by token; the sampler's
    # log-probabilities are constants (on the first iteration, equal to the policy's)
    step = 1e-6
    grad = []
    for t in range(tokens):
        up, down = as_floats(base), as_floats(base)
        up[t] += step
        down[t] -= step
        f = reference_loss(up, as_floats(old), as_floats(ref), as_floats(advantages), loss_type,
                           eps_low, eps_high, beta)  # fmt: skip
        g = reference_loss(down, as_floats(old), as_floats(ref), as_floats(advantages),
                           loss_type, eps_low, eps_high, beta)  # fmt: skip
        grad.append((f - g) / (2 * step))
    assert logps.grad is not None
    expected_grad = torch.tensor(grad, dtype=torch.float64)
    torch.testing.assert_close(logps.grad, expected_grad, atol=1e-7, rtol=1e-6)
    ratios = torch.exp(base - old)
    clipped = ((ratios < 1 - eps_low) & (advantages[completion] < 0)) | (
        (ratios > 1 + eps_high) & (advantages[completion] > 0)
    )
    assert float(out.clipped) == float(clipped.sum())
    if second_iteration:
        assert out.clipped > 0  # the case is exercised
    d = ref - base
    assert float(out.kl) == pytest.approx(float((torch.exp(d) - d - 1).sum()) if beta else 0.0)


def test_the_first_iterations_gradient_is_the_advantage_weighted_score():
    """With the sampler's own log-probabilities (ratio 1) the clip is inactive: d loss / d logp
    of a token is -A / |o| for grpo."""
    logps = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    completion = torch.tensor([0, 0, 1])
    advantages = torch.tensor([2.0, 2.0, -1.0])
    setting = GrpoLossSetting("grpo", 0.2, 0.2, 0.0, 4)
    grpo_loss(logps, logps.detach(), None, advantages, completion, setting).loss_sum.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([-1.0, -1.0, 1.0]))


def test_rows_outside_completions_carry_no_loss():
    supervised = torch.tensor([False, True, True, False, False, True, False])
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    completion = completion_of_rows(supervised, cu)
    assert completion.tolist() == [-1, 0, 0, -1, -1, 1, -1]
    logps = torch.randn(7, requires_grad=True)
    setting = GrpoLossSetting("dapo", 0.2, 0.2, 0.0, 4)
    out = grpo_loss(logps, logps.detach() - 0.1, None, torch.ones(7), completion, setting)
    out.loss_sum.backward()
    assert logps.grad is not None
    assert (logps.grad[~supervised] == 0).all() and (logps.grad[supervised] != 0).all()


def test_group_advantages_follow_their_definition():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    group = group_advantages(rewards, 4, "group")
    first = rewards[:4]
    expected = (first - first.mean()) / (first.std() + 1e-4)  # Bessel-corrected, as TRL
    torch.testing.assert_close(group.values[:4], expected)
    assert group.values[4:].abs().max() == 0
    assert group.zero_std.tolist() == [False, True]
    batch = group_advantages(rewards, 4, "batch")
    means = rewards.view(2, 4).mean(1).repeat_interleave(4)
    torch.testing.assert_close(batch.values, (rewards - means) / (rewards.std() + 1e-4))
    plain = group_advantages(rewards, 4, "none")
    torch.testing.assert_close(plain.values, rewards - means)


def _spread_on_rank(rank: int, port: int, halves: list, out) -> None:
    import torch.distributed as dist

    from tuneforge.train.objectives.grpo_advantages import spread_across_ranks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out[rank] = float(spread_across_ranks(torch.tensor(halves[rank]), torch.device("cpu")))
    finally:
        dist.destroy_process_group()


def test_the_batch_spread_spans_every_ranks_rewards():
    import socket

    import torch.multiprocessing as mp

    halves = [[1.0, 0.0, 0.5, 1.0], [0.25, 0.0, 0.0, 1.0, 0.75, 0.5]]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()
    mp.spawn(_spread_on_rank, args=(port, halves, out), nprocs=2)
    expected = torch.tensor(halves[0] + halves[1]).std()
    assert out[0] == out[1] == pytest.approx(float(expected), rel=1e-6)


def test_dynamic_sampling_keeps_the_groups_with_something_to_learn():
    """Groups rewarded alike are left out, the rest kept in order up to the first read's count;
    where no round has any, the first round is trained on whole (its advantages all 0)."""
    from tuneforge.train.objectives.dynamic_sampling import (
        ScoredRound,
        informative_groups,
        kept_groups,
    )
    from tuneforge.train.objectives.rollout import Prompts, Rollout

    def scored(rewards: list[float], tag: int) -> ScoredRound:
        count = len(rewards)
        prompts = [[tag, index // 2] for index in range(count)]
        sampled = Rollout(prompts, [[tag, index] for index in range(count)], 1.0)
        values = torch.tensor(rewards)
        asked = Prompts(prompts[::2], [None] * (count // 2), [{}] * (count // 2))
        return ScoredRound(
            asked,
            sampled,
            sampled.completions,
            values[:, None],
            values,
            group_advantages(values, 2, "group"),
        )

    first = scored([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], tag=1)  # groups: alike, varied, alike
    second = scored([0.0, 1.0, 1.0, 0.0, 1.0, 0.0], tag=2)  # all three varied
    assert informative_groups([first, second]) == 4
    sampled, advantages = kept_groups([first, second], group=2, wanted=3)
    assert sampled.completions == [[1, 2], [1, 3], [2, 0], [2, 1], [2, 2], [2, 3]]
    assert sampled.prompts == [[1, 1], [1, 1], [2, 0], [2, 0], [2, 1], [2, 1]]
    expected = torch.cat([first.advantages.values[2:4], second.advantages.values[:4]])
    assert torch.equal(advantages, expected) and sampled.seconds == 2.0
    alike = scored([1.0, 1.0, 0.0, 0.0], tag=3)
    sampled, advantages = kept_groups([alike, scored([1.0, 1.0], tag=4)], group=2, wanted=2)
    assert sampled is alike.sampled and not advantages.any()
