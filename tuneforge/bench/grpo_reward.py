"""The GRPO benchmark's reward, the same function for every system: the share of a completion's
tokens with an even id (a value that differs between completions, so that every group has
something to learn, and that needs no tokenizer)."""


def even_share(completion_ids: list[list[int]], **_: object) -> list[float | None]:
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]
