"""DAPO's dynamic sampling (Yu et al. 2025): a group whose completions were all rewarded alike
has no advantage, so it teaches nothing and only dilutes the step's average. Such groups are
left out, and further prompts are sampled until the micro-batch holds as many groups with
something to learn as its first read had prompts, or the rounds run out."""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from tuneforge.train.objectives.grpo_advantages import Advantages
from tuneforge.train.objectives.rollout import Prompts, Rollout


@dataclass
class ScoredRound:
    """One read's prompts, sampled and scored."""

    prompts: Prompts
    sampled: Rollout
    replies: list[list[int]]
    """Each completion without its end-of-turn token."""
    per_function: torch.Tensor
    """[completions, functions]"""
    rewards: torch.Tensor
    """[completions]: the weighted sum."""
    advantages: Advantages


def informative_groups(rounds: list[ScoredRound]) -> int:
    return sum(int((~r.advantages.zero_std).sum()) for r in rounds)


def any_rank_wants(wanted: bool, device: torch.device) -> bool:
    """True where this rank or another wants another round: every rank then samples it (under
    FSDP2 a sampling's forward is collective), and the ranks' loaders stay in step."""
    flag = torch.tensor([float(wanted)], device=device)
    if dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def kept_groups(rounds: list[ScoredRound], group: int, wanted: int) -> tuple[Rollout, torch.Tensor]:
    """The completions and advantages of the rounds' groups with something to learn, in order,
    at most `wanted` groups; the first round whole where none has (its advantages are 0: it
    changes nothing, and the step still runs its forward on every rank)."""
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    advantages: list[torch.Tensor] = []
    for scored in rounds:
        for index, alike in enumerate(scored.advantages.zero_std.tolist()):
            if alike or len(advantages) == wanted:
                continue
            rows = slice(index * group, (index + 1) * group)
            prompts += scored.sampled.prompts[rows]
            completions += scored.sampled.completions[rows]
            advantages.append(scored.advantages.values[rows])
    if not advantages:
        return rounds[0].sampled, rounds[0].advantages.values
    seconds = sum(scored.sampled.seconds for scored in rounds)
    return Rollout(prompts, completions, seconds), torch.cat(advantages)
