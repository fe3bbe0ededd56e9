"""GRPO's built-in reward functions: `exact_match`, `regex`, `length_penalty` (DAPO's soft
overlong penalty) and `numeric_match` (the last number written against the reference's)."""

import re
from collections.abc import Callable, Sequence

RewardFn = Callable[..., Sequence[float | None]]

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def exact_match(completions: list[str], answer: list[object], **_: object) -> list[float | None]:
    """1 where the completion, stripped, is the answer; None where the record has none."""
    return [
        None if a is None else float(c.strip() == str(a).strip())
        for c, a in zip(completions, answer, strict=True)
    ]


def regex(pattern: str) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)

    def matches(completions: list[str], **_: object) -> list[float]:
        return [float(compiled.search(c) is not None) for c in completions]

    return matches


def length_penalty(max_tokens: int, buffer_tokens: int) -> RewardFn:
    """DAPO's soft overlong punishment: 0 up to `max_tokens - buffer_tokens` tokens, then falling
    linearly to -1 at `max_tokens` (and -1 beyond)."""
    free = max_tokens - buffer_tokens

    def penalty(completion_ids: list[list[int]], **_: object) -> list[float]:
        return [max(-1.0, min(0.0, (free - len(ids)) / buffer_tokens)) for ids in completion_ids]

    return penalty


def last_number(text: object) -> float | None:
    """The last number written in `text` (thousands separated by commas or not), if any."""
    found = NUMBER.findall(str(text))
    return float(found[-1].replace(",", "")) if found else None


def numeric_match(field: str | None, tolerance: float) -> RewardFn:
    """1 where the completion's last number is the reference's within `tolerance`: the last
    number of the record field `field`, or of its answer; None where the reference has none."""

    def matches(completions: list[str], answer: list[object], **fields: list[object]):
        if field is not None and field not in fields:
            raise ValueError(f"the records have no field {field!r} (its `field` option)")
        references = answer if field is None else fields[field]
        rewards: list[float | None] = []
        for completion, reference in zip(completions, references, strict=True):
            wanted = None if reference is None else last_number(reference)
            got = last_number(completion)
            if wanted is None:
                rewards.append(None)
            else:
                rewards.append(float(got is not None and abs(got - wanted) <= tolerance))
        return rewards

    return matches
