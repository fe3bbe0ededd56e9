"""What a reinforcement-learning run's metrics lines say went wrong (GRPO's `metrics.jsonl`, read
by `tuneforge doctor log`): the reward collapsing from its best, groups whose completions were all
rewarded alike (nothing to learn from them), and the KL divergence to the reference blowing up."""

import json
import statistics
from dataclasses import dataclass, field

WINDOW = 10
"""Steps averaged: one step's reward is too noisy to judge by."""
COLLAPSE_SHARE = 0.5
"""The recent reward at or below this share of its best window is a collapse..."""
COLLAPSE_DROP = 0.1
"""... when it fell by at least this much."""
ZERO_STD_SHARE = 0.8
"""Groups with nothing to learn, as a share of the recent steps' groups, worth a finding."""
KL_LIMIT = 0.5
"""Nats per completion token: beyond it the policy has left its reference far behind."""


@dataclass
class RewardTrack:
    rewards: list[float] = field(default_factory=list)
    zero_std: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)

    def feed(self, line: str) -> None:
        """One line of a log: a metrics record of a training step is kept, the rest ignored."""
        if not line.lstrip().startswith("{"):
            return
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict) or not isinstance(record.get("reward"), int | float):
            return
        self.rewards.append(float(record["reward"]))
        if isinstance(record.get("frac_zero_std"), int | float):
            self.zero_std.append(float(record["frac_zero_std"]))
        if isinstance(record.get("kl"), int | float):
            self.kl.append(float(record["kl"]))

    def findings(self) -> list[tuple[str, int, str, str]]:
        """(code, count, message, advice) of each problem found."""
        found = []
        windows = [
            statistics.fmean(self.rewards[i : i + WINDOW])
            for i in range(0, max(len(self.rewards) - WINDOW + 1, 0))
        ]
        if windows:
            best, last = max(windows), windows[-1]
            if last <= COLLAPSE_SHARE * best and best - last >= COLLAPSE_DROP:
                found.append(
                    (
                        "reward_collapse",
                        len(self.rewards),
                        f"the mean reward of the last {WINDOW} steps is {last:.3f}, down from "
                        f"{best:.3f} at its best",
                        "lower the learning rate, keep the policy nearer its reference (grpo.beta "
                        "> 0, a smaller grpo.epsilon), and resume from a checkpoint before the fall",
                    )
                )
        recent = self.zero_std[-WINDOW:]
        if recent and statistics.fmean(recent) >= ZERO_STD_SHARE:
            found.append(
                (
                    "zero_std_groups",
                    len(recent),
                    f"{statistics.fmean(recent):.0%} of the groups of the last {len(recent)} "
                    "steps were rewarded alike: they give no gradient",
                    "the prompts are too easy or too hard for the policy: take prompts it "
                    "sometimes solves, raise grpo.num_generations or grpo.temperature, give "
                    "partial credit in the rewards, or set grpo.dynamic_sampling: true to "
                    "train only on groups with something to learn (more prompts are sampled in "
                    "their place)",
                )
            )
        kl = self.kl[-WINDOW:]
        if kl and statistics.fmean(kl) > KL_LIMIT:
            found.append(
                (
                    "kl_blowup",
                    len(kl),
                    f"the KL divergence to the reference averages {statistics.fmean(kl):.2f} "
                    f"nats per token over the last {len(kl)} steps (first steps: "
                    f"{statistics.fmean(self.kl[:WINDOW]):.3f})",
                    "lower the learning rate or raise grpo.beta; check that the rewards cannot "
                    "be earned by degenerate completions (reward hacking)",
                )
            )
        return found
