"""GRPO as an objective: each micro-batch read from the loader gives its prompts, the policy
samples `num_generations` completions of each (`rollout.py`), the reward functions score them
(`rewards.py`), and the batch the step trains on is the prompts with their completions, each
completion's advantage carried with it (`grpo_advantages.py`); the loss is `grpo_loss.py`'s.
With `num_iterations` μ > 1 the step's micro-batches are trained on μ times, against the
log-probabilities of the policy that sampled them, and the loader is not read meanwhile. With
dynamic sampling, groups rewarded alike are left out and more prompts read in their place
(`dynamic_sampling.py`); a few groups go to `completions.jsonl` (`completion_log.py`).

Held out, each prompt is answered once, greedily, and scored: the held-out loss is minus the
mean reward."""

import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tuneforge.config.objectives.grpo import GRPO, GrpoSection
from tuneforge.data.chat import stop_ids
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import generate
from tuneforge.runs.files import COMPLETIONS_FILE
from tuneforge.train.objectives.completion_log import CompletionLog
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.dynamic_sampling import (
    ScoredRound,
    any_rank_wants,
    informative_groups,
    kept_groups,
)
from tuneforge.train.objectives.grpo_advantages import (
    STD_FLOOR,
    group_advantages,
    nan_std,
    spread_across_ranks,
)
from tuneforge.train.objectives.grpo_loss import GrpoLossSetting, completion_of_rows, grpo_loss
from tuneforge.train.objectives.kept_batches import again, batch_of_state, batch_state
from tuneforge.train.objectives.pairs import (
    AdaptersOffReference,
    FrozenCopyReference,
    model_token_logps,
    starting_model,
)
from tuneforge.train.objectives.rewards import (
    RewardFunction,
    reference_answers,
    reward_functions,
    score,
    weighted_rewards,
)
from tuneforge.train.objectives.rollout import Prompts, prompts_of, sample, training_batch
from tuneforge.train.objectives.seam import (
    Metric,
    Objective,
    ObjectiveOutput,
    hidden_states_and_aux,
)
from tuneforge.train.sequence_logps import token_logps

T = TypeVar("T")
V = TypeVar("V")

GENERATOR_SEED_OFFSET = 7919
"""The sampler's seed is the run's plus this plus the rank (each rank samples its own)."""


def grpo_metrics(functions: list[RewardFunction], grpo: GrpoSection) -> tuple[Metric, ...]:
    by_function = tuple(Metric(f"reward_{f.name}", per="completions") for f in functions)
    kl = (Metric("kl", per="completion_tokens", held_out=False),) if grpo.beta else ()
    dynamic = grpo.dynamic_sampling
    rounds = (Metric("sampling_rounds", per="step", held_out=False),) if dynamic else ()
    return (
        Metric("reward", per="scored", headline=True),
        *by_function,
        Metric("reward_std", per="groups", held_out=False),
        Metric("frac_zero_std", per="groups", percent=True, held_out=False),
        Metric("completion_length", per="completions"),
        Metric("clip_ratio", per="completion_tokens", percent=True, held_out=False),
        *kl,
        *rounds,
        Metric("generation_tokens_per_s", per="generation_s"),
        Metric("completions", per="step", held_out=False),
        Metric("scored", per="step"),
        Metric("unscored", per="step", held_out=False),
        Metric("groups", per="step", held_out=False),
        Metric("completion_tokens", per="step", held_out=False),
        Metric("generation_s", per="step"),
    )


class GrpoObjective(Objective):
    def __init__(
        self,
        model: Decoder,
        grpo: GrpoSection,
        tokenizer,
        functions: list[RewardFunction],
        reference: AdaptersOffReference | FrozenCopyReference | None,
        accumulation: int,
        seed: int,
        chunk_tokens: int = 1024,
        completion_log: CompletionLog | None = None,
    ) -> None:
        super().__init__(model)
        self.completion_log = completion_log
        self.grpo, self.tokenizer, self.functions = grpo, tokenizer, functions
        self.reference, self.chunk_tokens = reference, chunk_tokens
        self.metrics = grpo_metrics(functions, grpo)
        self.setting = GrpoLossSetting(
            grpo.loss_type, grpo.epsilon, grpo.upper_clip, grpo.beta, grpo.max_new_tokens
        )
        self.stop = stop_ids(tokenizer)
        self.accumulation = accumulation
        self.calls = 0
        """Micro-batches made so far: the first `accumulation` of each cycle of accumulation ×
        num_iterations are sampled, the rest trained on again."""
        self.kept: list[PackedBatch | None] = [None] * accumulation
        self.sampled: list[PackedBatch] = []
        """The step's micro-batches sampled so far."""
        self.pending_log: tuple[ScoredRound, int] | None = None
        """The round and step the completion log writes once the step is sampled."""
        self.generator = torch.Generator(device=model.lm_head.weight.device)
        self.generator.manual_seed(seed)

    def reads_batch(self) -> bool:
        return self.calls % (self.accumulation * self.grpo.num_iterations) < self.accumulation

    def make_batch(
        self, read: PackedBatch | None, read_more: Callable[[], PackedBatch] | None = None
    ) -> PackedBatch:
        slot = self.calls % (self.accumulation * self.grpo.num_iterations)
        self.calls += 1
        if slot >= self.accumulation:
            kept = self.kept[slot % self.accumulation]
            assert kept is not None
            return again(kept)
        assert read is not None
        step = (self.calls - 1) // self.accumulation + 1
        logged = self.completion_log is not None and slot == 0 and self.completion_log.due(step)
        batch = self.rollout(read, read_more, step if logged else None)
        if self.grpo.num_iterations > 1:
            self.kept[slot] = batch
        self.sampled.append(batch)
        if slot == self.accumulation - 1:
            self._step_sampled()
        return batch

    def _step_sampled(self) -> None:
        """Every micro-batch of the step sampled (the step makes them all before its first
        forward): with `scale_rewards: batch` their advantages, centred on their groups so far,
        are divided by the deviation of all the step's rewards, on every rank, as TRL divides
        its generation batch's; then the completion log is written."""
        scale = 1.0
        if self.grpo.scale_rewards == "batch":
            rewards = torch.cat([batch.extras["rewards"] for batch in self.sampled])
            device = self.model.lm_head.weight.device
            spread = (
                spread_across_ranks(rewards, device) if dist.is_initialized() else nan_std(rewards)
            )
            scale = 1.0 / (float(spread) + STD_FLOOR)
            for batch in self.sampled:  # NaN (fewer than two scored): no advantage
                batch.extras["advantages"] = (batch.extras["advantages"] * scale).nan_to_num(0.0)
        if self.pending_log is not None:
            self._log(*self.pending_log, scale)
        self.sampled, self.pending_log = [], None

    def rollout(
        self,
        read: PackedBatch,
        read_more: Callable[[], PackedBatch] | None = None,
        logged_step: int | None = None,
    ) -> PackedBatch:
        """The batch to train on: `read`'s prompts with their completions; with dynamic
        sampling, only the groups with something to learn, more read with `read_more`. With
        `logged_step`, the first groups go to the completion log."""
        grpo = self.grpo
        rounds = [self._sampled_round(read)]
        if logged_step is not None:
            self.pending_log = (rounds[0], logged_step)
        wanted = rounds[0].advantages.zero_std.numel()
        device = self.model.lm_head.weight.device
        if grpo.dynamic_sampling:
            while (
                len(rounds) < grpo.max_sampling_rounds
                and read_more is not None
                and any_rank_wants(informative_groups(rounds) < wanted, device)
            ):
                rounds.append(self._sampled_round(read_more()))
            sampled, advantages = kept_groups(rounds, grpo.num_generations, wanted)
        else:
            sampled, advantages = rounds[0].sampled, rounds[0].advantages.values
        batch = training_batch(sampled).to(device, read.tokens.device)
        every = [r.sampled for r in rounds]
        extras = {
            "advantages": advantages,
            "rewards": torch.cat([r.rewards for r in rounds]),
            "unscored": torch.stack([r.advantages.unscored for r in rounds]).sum().float(),
            "reward_by_function": torch.cat([r.per_function for r in rounds]),
            "completion_length": torch.tensor(
                [float(len(reply)) for r in rounds for reply in r.replies]
            ),
            "group_std": torch.cat([r.advantages.group_std for r in rounds]),
            "zero_std": torch.cat([r.advantages.zero_std for r in rounds]).float(),
            "generation_s": torch.tensor([sum(s.seconds for s in every)]),
            "generated_tokens": torch.tensor(
                [float(sum(len(c) for s in every for c in s.completions))]
            ),
            "sampling_rounds": torch.tensor([float(len(rounds))]),
        }
        batch.extras = {name: value.to(device) for name, value in extras.items()}
        if self.reference is not None:
            reference = self.reference
            batch.extras["ref_logps"] = self.within_forward(
                lambda: reference.token_logps(batch, self.chunk_tokens, grpo.temperature)
            )
        if grpo.num_iterations > 1:  # the ratio's denominator: the policy that sampled them
            batch.extras["old_logps"] = self.within_forward(
                lambda: model_token_logps(self.model, batch, self.chunk_tokens, grpo.temperature)
            )
        return batch

    def _sampled_round(self, read: PackedBatch) -> ScoredRound:
        """`read`'s prompts, each answered `num_generations` times, and the replies scored."""
        grpo = self.grpo
        prompts = prompts_of(read)
        sampled = self.within_forward(
            lambda: sample(
                self.model, prompts.ids, grpo.num_generations, grpo.max_new_tokens, self.stop,
                self.generator, grpo.temperature, grpo.top_p, grpo.top_k,
            )
        )  # fmt: skip
        replies = [self._reply(c) for c in sampled.completions]
        per_function = self._scored(prompts, replies, grpo.num_generations)
        rewards = weighted_rewards(per_function, self.functions)
        # scale_rewards batch: centred here, divided once the step's every reward is known
        scale = "none" if grpo.scale_rewards == "batch" else grpo.scale_rewards
        advantages = group_advantages(rewards, grpo.num_generations, scale)
        return ScoredRound(prompts, sampled, replies, per_function, rewards, advantages)

    def _scored(self, prompts: Prompts, replies: list[list[int]], group: int) -> torch.Tensor:
        """[replies, functions]: each reward function's score of each reply, `group` replies
        to each prompt one after another (prompts and answers decoded once each)."""

        def each(values: list[V]) -> list[V]:
            return [value for value in values for _ in range(group)]

        return score(
            self.functions,
            each([self.tokenizer.decode(p) for p in prompts.ids]),
            [self._decode(r) for r in replies],
            replies,
            each([None if a is None else self._decode(a) for a in prompts.answers]),
            each(prompts.fields),
        )

    def _log(self, scored: ScoredRound, step: int, scale: float = 1.0) -> None:
        assert self.completion_log is not None
        group, prompts = self.grpo.num_generations, scored.prompts
        groups = min(self.completion_log.groups, len(prompts.ids))
        replies = [None if a is None else self._decode(a) for a in prompts.answers[:groups]]
        answers = reference_answers(replies, prompts.fields[:groups])
        names = [function.name for function in self.functions]
        records = []
        for index in range(groups):
            prompt = self.tokenizer.decode(prompts.ids[index])
            for row in range(index * group, (index + 1) * group):
                values = scored.per_function[row].tolist()
                records.append(
                    {
                        "step": step,
                        "group": index,
                        "prompt": prompt,
                        "answer": answers[index],
                        "completion": self._decode(scored.replies[row]),
                        "reward": none_if_nan(float(scored.rewards[row])),
                        "rewards": {n: none_if_nan(v) for n, v in zip(names, values, strict=True)},
                        "advantage": float(scored.advantages.values[row]) * scale,
                    }
                )
        self.completion_log.write(records)

    def _reply(self, completion: list[int]) -> list[int]:
        """A completion without its end-of-turn token."""
        return completion[:-1] if completion and completion[-1] in self.stop else completion

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def units(self, batch: PackedBatch) -> int:
        if "advantages" not in batch.extras or self.grpo.loss_type != "dapo":
            return batch.num_documents
        return batch.num_loss_tokens

    @torch.no_grad()
    def within_forward(self, work: Callable[[], T]) -> T:
        """`work` run inside this module's forward, without gradients: under FSDP2 the root
        unit's parameters (embedding, output layer) are then gathered as for any forward."""
        return self(None, work)

    def forward(self, batch: PackedBatch | None, work: Callable[[], Any] | None = None) -> Any:
        if work is not None:
            return work()
        assert batch is not None
        extras = batch.extras
        if "advantages" not in extras:
            return self.held_out(batch)
        hidden, aux = hidden_states_and_aux(self.model, batch)
        logps = token_logps(
            hidden, self.model.lm_head.weight, batch.labels, self.chunk_tokens,
            self.grpo.temperature,
        )  # fmt: skip
        supervised = batch.labels != IGNORE_INDEX
        completion = completion_of_rows(supervised, batch.packed.cu_seqlens)
        advantages = extras["advantages"][completion.clamp(min=0)]
        old = extras.get("old_logps", logps.detach())
        out = grpo_loss(logps, old, extras.get("ref_logps"), advantages, completion, self.setting)
        metrics = self._rollout_sums(extras, supervised)
        metrics["clip_ratio"] = out.clipped
        if self.grpo.beta:
            metrics["kl"] = out.kl
        return ObjectiveOutput(out.loss_sum, aux, metrics)

    def _rollout_sums(
        self, extras: dict[str, torch.Tensor], supervised: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        by_function = extras["reward_by_function"].nansum(dim=0)
        rewards = extras["rewards"]
        sums = {
            "reward": rewards.nansum(),
            "reward_std": extras["group_std"].nansum(),
            "frac_zero_std": extras["zero_std"].sum(),
            "completion_length": extras["completion_length"].sum(),
            "generation_tokens_per_s": extras["generated_tokens"].sum(),
            "completions": rewards.new_tensor(float(rewards.numel())),
            "scored": (~rewards.isnan()).sum().float(),
            "unscored": extras["unscored"],
            "groups": extras["group_std"].new_tensor(float(extras["group_std"].numel())),
            "completion_tokens": supervised.float().sum(),
            "generation_s": extras["generation_s"].sum(),
        }
        for index, function in enumerate(self.functions):
            sums[f"reward_{function.name}"] = by_function[index]
        if self.grpo.dynamic_sampling:
            sums["sampling_rounds"] = extras["sampling_rounds"].sum()
        return sums

    @torch.no_grad()
    def held_out(self, batch: PackedBatch) -> ObjectiveOutput:
        """One greedy completion of each prompt, scored: minus the rewards' sum is the loss."""
        prompts = prompts_of(batch)
        started = time.perf_counter()
        replies = generate(self.model, prompts.ids, self.grpo.max_new_tokens, self.stop)
        seconds = time.perf_counter() - started
        per_function = self._scored(prompts, replies, 1)
        rewards = weighted_rewards(per_function, self.functions)
        zero = torch.zeros((), device=batch.labels.device)
        metrics = {metric.name: zero for metric in self.metrics}
        by_function = per_function.nansum(dim=0)
        metrics |= {
            "reward": rewards.nansum().to(zero.device),
            "completions": zero.new_tensor(float(len(replies))),
            "scored": (~rewards.isnan()).sum().float().to(zero.device),
            "completion_length": zero.new_tensor(float(sum(len(r) for r in replies))),
            "generation_tokens_per_s": zero.new_tensor(float(sum(len(r) for r in replies))),
            "generation_s": zero.new_tensor(seconds),
        }
        for index, function in enumerate(self.functions):
            metrics[f"reward_{function.name}"] = by_function[index].to(zero.device)
        return ObjectiveOutput(-metrics["reward"], zero, metrics)

    def resume_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "generator": self.generator.get_state().tolist(),
            "calls": self.calls,
        }
        if self.grpo.num_iterations > 1:
            state["kept"] = [None if b is None else batch_state(b) for b in self.kept]
        return state

    def load_resume_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.calls = int(state["calls"])
        device = self.model.lm_head.weight.device
        for slot, kept in enumerate(state.get("kept", [])):
            self.kept[slot] = None if kept is None else batch_of_state(kept, device)


def none_if_nan(value: float) -> float | None:
    """A reward as JSON holds it: None where no function scored (NaN is no JSON value)."""
    return None if math.isnan(value) else value


def build(setup: ObjectiveSetup) -> GrpoObjective:
    config = setup.config
    grpo = config.grpo
    if setup.tokenizer is None:
        raise ValueError("GRPO decodes its completions: the setup needs the run's tokenizer")
    held = [f for f in GRPO.frozen_models(config) if f.role == "reference"]
    reference = starting_model(setup.model, held[0].kind, setup.dims.sharded) if held else None
    rank = dist.get_rank() if dist.is_initialized() else 0
    objective = GrpoObjective(
        setup.model,
        grpo,
        setup.tokenizer,
        reward_functions(grpo, setup.device, config.model.dtype),
        reference,
        config.train.grad_accum_steps,
        config.train.seed + GENERATOR_SEED_OFFSET + rank,
        config.train.loss_chunk_tokens,
        completion_log(config) if rank == 0 else None,
    )
    if setup.resumed:
        objective.load_resume_state(setup.resumed)
        if objective.completion_log is not None:
            objective.completion_log.truncate_after(
                objective.calls // config.train.grad_accum_steps
            )
    return objective


def completion_log(config) -> CompletionLog | None:
    grpo = config.grpo
    if not grpo.log_completions:
        return None
    file = config.run.directory / COMPLETIONS_FILE
    return CompletionLog(file, grpo.log_completions, config.logging.log_steps, grpo.num_iterations)


COMPONENT = ObjectiveComponent(GRPO, build)
