"""GRPO's reward functions: the built-in ones (`builtin_rewards.py`) and a user's own by import
path (`module:function`), run as trusted code like the configuration. Each is called with
keyword arguments — `prompts`, `completions` (decoded, special tokens left out),
`completion_ids`, `answer` (the record's reference reply; for a prompt alone, its `answer` field
if it has one, else None), and each other field of the records, one value per completion (None
where its record lacks it) — and returns one float per completion (None where it does not
apply: that function then adds nothing; a completion no function scores is left out of its
group's baseline and gets no advantage). A value that is not a finite number stops the run,
naming the function, the record and the value."""

import math
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real

import torch

from tuneforge.config.objectives.grpo import REWARD_ARGUMENTS, GrpoSection, RewardSpec
from tuneforge.config.objectives.reward_import import import_reward
from tuneforge.data.records import ORIGIN_FIELD
from tuneforge.errors import TuneforgeError
from tuneforge.train.objectives.builtin_rewards import (
    RewardFn,
    exact_match,
    length_penalty,
    numeric_match,
    regex,
)


class RewardError(TuneforgeError):
    """A reward function that cannot be loaded, raised, or returned the wrong values."""


@dataclass(frozen=True)
class RewardFunction:
    name: str
    """Its metric's name: `reward_<name>`."""
    function: RewardFn
    weight: float
    field: str
    """Where the configuration names it (`grpo.rewards.0.function`)."""


def _built(
    spec: RewardSpec, grpo: GrpoSection, field: str, device: torch.device, dtype: str
) -> RewardFn:
    if spec.function == "model":
        from tuneforge.train.objectives.model_reward import ModelReward

        assert spec.path is not None  # the configuration's rules ask for it
        return ModelReward(spec.path, device, dtype)
    if spec.function == "exact_match":
        return exact_match
    if spec.function == "numeric_match":
        return numeric_match(spec.field, spec.tolerance)
    if spec.function == "regex":
        assert spec.pattern is not None  # the configuration's rules ask for it
        return regex(spec.pattern)
    if spec.function == "length_penalty":
        most = spec.max_tokens or grpo.max_new_tokens
        return length_penalty(most, spec.buffer_tokens or max(1, most // 4))
    try:
        return import_reward(spec.function, field)  # type: ignore[return-value]
    except ValueError as error:  # the preflight said so already; a module can change meanwhile
        raise RewardError(str(error)) from None


def reward_functions(
    grpo: GrpoSection, device: torch.device | None = None, dtype: str = "float32"
) -> list[RewardFunction]:
    """The functions of `grpo.rewards`; a reward model is loaded on `device` in `dtype` (the
    policy's)."""
    functions = []
    device = device or torch.device("cpu")
    for index, (spec, weight) in enumerate(zip(grpo.rewards, grpo.reward_weights, strict=True)):
        field = f"grpo.rewards.{index}.function"
        name = spec.function.rpartition(":")[2]
        built = _built(spec, grpo, field, device, dtype)
        functions.append(RewardFunction(name, built, weight, field))
    names = [f.name for f in functions]
    for index, function in enumerate(functions):  # two of one name: the metrics keep both
        if names.count(function.name) > 1:
            functions[index] = RewardFunction(
                f"{function.name}_{index}", function.function, function.weight, function.field
            )
    return functions


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


OWN_ARGUMENTS = tuple(name for name in REWARD_ARGUMENTS if name != "answer")


def reference_answers(replies: list[str | None], fields: list[dict[str, object]]) -> list[object]:
    """Each record's answer: its reference reply, or for a prompt alone its `answer` field
    (None where it has neither)."""
    answers: list[object] = list(replies)
    for index, record in enumerate(fields):
        if "answer" not in record:
            continue
        if replies[index] is not None:
            raise RewardError(
                "a record has both a reference reply and a field named 'answer': the reward "
                "functions' `answer` is the reply; rename the field in the data"
            )
        answers[index] = record["answer"]
    return answers


def record_arguments(fields: list[dict[str, object]]) -> dict[str, list[object]]:
    """The records' fields other than `answer` as keyword arguments, one value per completion."""
    names = dict.fromkeys(
        name for record in fields for name in record if name not in ("answer", ORIGIN_FIELD)
    )
    taken = [name for name in names if name in OWN_ARGUMENTS]
    if taken:
        raise RewardError(
            f"the records have a field named {taken[0]!r}, which is the reward functions' own "
            f"argument ({', '.join(OWN_ARGUMENTS)}): rename it in the data"
        )
    return {name: [record.get(name) for record in fields] for name in names}


def score(
    functions: list[RewardFunction],
    prompts: list[str],
    completions: list[str],
    completion_ids: list[list[int]],
    answers: list[str | None],
    fields: list[dict[str, object]] | None = None,
) -> torch.Tensor:
    """float32 [completions, functions]: each function's reward of each completion (NaN where
    it returned None); `fields`: each completion's record fields."""
    fields = fields or [{} for _ in answers]
    references, arguments = reference_answers(answers, fields), record_arguments(fields)
    columns = []
    for function in functions:
        try:
            values = function.function(
                prompts=prompts,
                completions=completions,
                completion_ids=completion_ids,
                answer=references,
                **arguments,
            )
        except Exception as error:
            raise RewardError(
                f"reward function {function.name} ({function.field}) raised "
                f"{type(error).__name__}: {error}{_where(error)}"
            ) from error
        values = list(values) if isinstance(values, Sequence | torch.Tensor) else values
        if not isinstance(values, list) or len(values) != len(completions):
            got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
            raise RewardError(
                f"reward function {function.name} ({function.field}) returned {got} for "
                f"{len(completions)} completions: it must return one float per completion"
            )
        column = []
        for index, value in enumerate(values):
            if value is None:
                column.append(math.nan)
                continue
            if not isinstance(value, Real | torch.Tensor) or isinstance(value, bool):
                raise RewardError(
                    f"reward function {function.name} ({function.field}) returned "
                    f"{type(value).__name__} {value!r}: each value must be a float (or None)"
                )
            number = float(value)
            if not math.isfinite(number):
                origin = fields[index].get(ORIGIN_FIELD, "a record whose origin is unknown")
                raise RewardError(
                    f"reward function {function.name} ({function.field}) returned {number} for "
                    f"the completion of the record at {origin}: a reward must be a finite "
                    "number, or None where the function does not apply; nothing was trained "
                    "on this batch"
                )
            column.append(number)
        columns.append(column)
    return torch.tensor(columns, dtype=torch.float32).t().reshape(len(completions), -1)


def weighted_rewards(per_function: torch.Tensor, functions: list[RewardFunction]) -> torch.Tensor:
    """[completions]: the weighted sum over functions, a None (NaN) adding nothing; NaN where
    no function scored the completion (TRL's unscorable completion)."""
    weights = torch.tensor([f.weight for f in functions], dtype=per_function.dtype)
    summed = torch.nansum(per_function * weights, dim=1)
    return summed.masked_fill(per_function.isnan().all(dim=1), math.nan)
