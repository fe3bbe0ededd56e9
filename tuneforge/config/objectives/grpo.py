"""`train.objective: grpo`: reinforcement learning with verifiable rewards (GRPO, Shao et al.
2024; its Dr. GRPO and DAPO variants), as the configuration declares it: the `grpo:` section,
its rules and the reference it holds when `beta` > 0. Each prompt of the training data is
answered `num_generations` times by the policy, the completions are scored by the reward
functions, and each completion's advantage is its reward against its group's."""

import re
from typing import Literal, get_args

from pydantic import Field, field_validator

from tuneforge.config.objectives.declaration import (
    FrozenModel,
    ObjectiveDeclaration,
    starting_model_kind,
)
from tuneforge.config.rules import model_split_refused, rule
from tuneforge.config.sections.base import InputPath, Section
from tuneforge.config.sections.model import ModelSection
from tuneforge.sequence_classifier import not_a_reward_model

GrpoLossName = Literal["grpo", "dr_grpo", "dapo"]
GRPO_LOSSES: tuple[str, ...] = get_args(GrpoLossName)
BUILT_IN_REWARDS = ("exact_match", "regex", "length_penalty", "numeric_match", "model")
REWARD_OPTIONS = {
    "exact_match": (),
    "regex": ("pattern",),
    "length_penalty": ("max_tokens", "buffer_tokens"),
    "numeric_match": ("field", "tolerance"),
    "model": ("path",),
}
"""The options of `RewardSpec` each built-in reward reads; a function of yours reads none."""
REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "answer")
"""What every reward function is called with; a record field of one of these names is refused
(`answer` is the record's reference, or its own `answer` field for a prompt alone)."""


class RewardSpec(Section):
    function: str
    """`exact_match` (the completion, stripped, equals the record's reference reply), `regex` (1
    where `pattern` matches the completion), `length_penalty` (DAPO's soft overlong penalty: 0 up
    to `max_tokens` - `buffer_tokens` tokens, falling to -1 at `max_tokens`), `numeric_match` (1
    where the completion's last number is the reference's within `tolerance`), `model` (a reward
    model's score of the prompt and completion, `path`), or a function of yours as
    `module:function` (run as trusted code, like the configuration itself)."""
    pattern: str | None = None
    """`regex`: the pattern, searched in the completion (`re.search`, with `re.DOTALL`)."""
    max_tokens: int | None = Field(None, ge=1)
    """`length_penalty`: the length that takes the whole penalty (default: grpo.max_new_tokens)."""
    buffer_tokens: int | None = Field(None, ge=1)
    """`length_penalty`: the lengths below `max_tokens` over which the penalty grows (default: a
    quarter of `max_tokens`)."""
    field: str | None = None
    """`numeric_match`: the record field whose last number is the reference (default: the
    record's answer: its reference reply, or for a prompt alone its `answer` field)."""
    tolerance: float = Field(1e-6, ge=0)
    """`numeric_match`: the largest difference still counted a match."""
    path: InputPath | None = None
    """`model`: the reward model's directory, a one-label `...ForSequenceClassification`
    checkpoint (a `train.objective: reward` run's `final/`). It scores each prompt with its
    completion, rendered as the training conversations are, on the policy's device."""

    @field_validator("function")
    @classmethod
    def _known_or_importable(cls, value: str) -> str:
        if value in BUILT_IN_REWARDS:
            return value
        module, _, name = value.partition(":")
        if not (module and name):
            raise ValueError(
                f"{value!r} is neither a built-in reward ({', '.join(BUILT_IN_REWARDS)}) nor "
                "an import path `module:function`"
            )
        return value


class GrpoSection(Section):
    num_generations: int = Field(8, ge=2)
    """Completions sampled per prompt (the group each completion's reward is compared within)."""
    max_new_tokens: int = Field(256, ge=1)
    """The longest completion; one that reaches it without the end of its turn is cut there."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the completions; the policy's, the sampler's and the reference's
    log-probabilities in the loss are taken at it too (the distribution that drew them)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: only the likeliest tokens whose probabilities add up to it."""
    top_k: int = Field(0, ge=0)
    """Only the k likeliest tokens (0: all)."""
    beta: float = Field(0.0, ge=0)
    """Weight of the KL divergence to the reference (the model as training started); 0: no
    reference is held or run."""
    epsilon: float = Field(0.2, gt=0, lt=1)
    """The importance ratio is clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float | None = Field(None, gt=0)
    """The upper clip (DAPO's clip-higher when above epsilon); default: epsilon."""
    loss_type: GrpoLossName = "grpo"
    """How token losses are averaged: `grpo` (each completion's mean, then the mean over
    completions), `dr_grpo` (the sum over tokens divided by completions × max_new_tokens: no
    length bias), `dapo` (the mean over every completion token of the step)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantages are rewards minus their group's mean, divided by the group's standard
    deviation (`group`), the step's (`batch`: every completion of every micro-batch and rank),
    or not divided (`none`, Dr. GRPO)."""
    num_iterations: int = Field(1, ge=1)
    """Optimizer steps on each batch of completions (μ): after the first, the ratio to the policy
    that generated them is clipped."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose completions were all rewarded alike (no advantage)
    are left out of the step, and further prompts are read and sampled, up to
    `max_sampling_rounds` reads a micro-batch, until it holds as many groups with something to
    learn as its first read had prompts."""
    max_sampling_rounds: int = Field(3, ge=1)
    """With dynamic_sampling: the most reads (and samplings) one micro-batch may take."""
    log_completions: int = Field(1, ge=0)
    """Groups of completions written to `completions.jsonl` in the run directory every
    `logging.log_steps` steps, each with its prompt, reference answer, rewards and advantage
    (0: none)."""
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(function="exact_match")])
    """The reward functions: a name (`exact_match`, `module:function`) or a mapping with
    `function` and its options; a completion's reward is their weighted sum."""
    weights: list[float] | None = None
    """One weight per reward function (default: 1 each)."""

    @field_validator("rewards", mode="before")
    @classmethod
    def _names_are_specs(cls, value: object) -> object:
        if isinstance(value, list):
            return [{"function": v} if isinstance(v, str) else v for v in value]
        return value

    @property
    def reward_weights(self) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(self.rewards)

    @property
    def upper_clip(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def grpo_frozen_models(lora, grpo: GrpoSection) -> tuple[FrozenModel, ...]:
    """The reference (with `beta` > 0) and the reward models, each held on the policy's device
    and run over every completion of a step (a reward model as a teacher is counted)."""
    found = []
    if grpo.beta > 0:
        kind = starting_model_kind(lora)
        found.append(FrozenModel("reference", kind, holds_weights=kind == "frozen_copy"))
    for index, spec in enumerate(grpo.rewards):
        if spec.function == "model" and spec.path is not None:
            section = ModelSection(path=spec.path)
            field = f"grpo.rewards.{index}.path"
            found.append(FrozenModel("reward model", "online", section, field, holds_weights=True))
    return tuple(found)


GRPO = ObjectiveDeclaration(
    name="grpo",
    summary="reinforcement learning from reward functions on sampled completions (GRPO, Dr. "
    "GRPO, DAPO), as the `grpo` section says",
    settings="grpo",
    reads=("lora", "grpo"),
    frozen=grpo_frozen_models,
    title=lambda grpo: f"grpo {grpo.loss_type}",
    loss_label=lambda grpo: f"GRPO {grpo.loss_type} policy loss (held out: minus the mean reward)",
    cross_entropy_metric=None,
    refuses_captured_step="a GRPO step samples completions first, which is not captured",
    samples_per_record=lambda grpo: grpo.num_generations,
    keeps_record_fields=True,
    generated_tokens=lambda grpo: grpo.max_new_tokens,
)


def reward_option_problems(spec: RewardSpec, path: str) -> list[tuple[str, str, str]]:
    """A reward's options that its function does not read, and a pattern that does not compile."""
    problems = []
    reads = REWARD_OPTIONS.get(spec.function, ())
    for option in sorted(spec.model_fields_set - {"function"} - set(reads)):
        takes = f"reads {', '.join(reads)}" if reads else "takes no option"
        fix = "drop it" + (
            "; a function of yours receives every record field as an argument"
            if spec.function not in REWARD_OPTIONS
            else ""
        )
        problems.append((f"{path}.{option}", f"{spec.function} {takes}", fix))
    if spec.function == "model":
        if spec.path is None:
            problems.append((f"{path}.path", "a model reward needs the reward model", "set it"))
        elif spec.path.exists() and (why := not_a_reward_model(spec.path)) is not None:
            # a missing path is already reported where paths resolve
            fix = "give a train.objective: reward run's final/ directory"
            problems.append((f"{path}.path", why, fix))
    if spec.function == "regex" and not spec.pattern:
        problems.append((f"{path}.pattern", "a regex reward needs its pattern", "set it"))
    if spec.function == "regex" and spec.pattern:
        try:
            re.compile(spec.pattern)
        except re.error as error:
            problems.append(
                (f"{path}.pattern", f"{spec.pattern!r} is no regular expression: {error}",
                 "write a Python `re` pattern (in YAML, quote it in single quotes)")
            )  # fmt: skip
    return problems


@rule("train", "grpo", "parallel", "data")
def grpo_settings(train, grpo: GrpoSection, parallel, data) -> list[tuple[str, str, str]]:
    if train.objective != GRPO.name:
        return []
    problems = model_split_refused(
        parallel,
        "GRPO samples on each rank's own prompts through the whole model: tensor and expert "
        "parallelism are not supported for it yet",
    )
    if grpo.weights is not None and len(grpo.weights) != len(grpo.rewards):
        problems.append(
            (
                "grpo.weights",
                f"{len(grpo.weights)} weights for {len(grpo.rewards)} reward functions",
                "give one weight per entry of grpo.rewards (or drop grpo.weights: 1 each)",
            )
        )
    if not grpo.rewards:
        problems.append(("grpo.rewards", "no reward function", "list at least one"))
    for index, spec in enumerate(grpo.rewards):
        problems += reward_option_problems(spec, f"grpo.rewards.{index}")
    for index, source in enumerate(data.train):
        if source.format == "preference":
            problems.append(
                (
                    f"data.train.{index}.format",
                    "GRPO samples its own replies and scores them: a preference pair's "
                    "rejected reply would be ignored",
                    "give prompts (format prompt) or conversations, whose last reply is the "
                    "reference; train on pairs with train.objective dpo or orpo",
                )
            )
    if grpo.epsilon_high is not None and grpo.epsilon_high < grpo.epsilon:
        problems.append(
            (
                "grpo.epsilon_high",
                f"{grpo.epsilon_high} is below epsilon ({grpo.epsilon})",
                "set it at or above epsilon (DAPO's clip-higher), or drop it",
            )
        )
    return problems
