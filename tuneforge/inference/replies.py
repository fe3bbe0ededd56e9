"""Answer a whole file of prompts with a model, in batches, and write the conversations as an SFT
dataset in the openai messages format: sequence-level distillation (a teacher's replies become
a student's training data)."""

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.data.formats import ROLES, check_turns
from tuneforge.data.records import DataError, RecordError, iter_raw_records
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import generate

log = logging.getLogger(__name__)


NEEDS = 'needs "prompt" (a string) or "messages" (a list) ending with a user turn'
MOST_NAMED = 10
"""Bad lines named in one error; the rest are counted."""


def prompt_messages(record: object) -> list[dict[str, str]]:
    """The conversation to answer: `{"prompt": text}`, or `{"messages": [...]}` ending with a user
    turn (a final assistant turn, as in an SFT file, is left out and answered anew). The turns
    obey training's rules (`data.formats.check_turns`), so that the replies written are data
    training reads."""
    if isinstance(record, RecordError):
        raise record
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise RecordError(f'"prompt" must be a string, not {type(prompt).__name__}')
        if not prompt.strip():
            raise RecordError('"prompt" is empty')
        return [{"role": "user", "content": prompt}]
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RecordError(NEEDS)
    if isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    if not messages:
        raise RecordError(f"{NEEDS}; this one has only an assistant turn")
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") in ROLES and last["role"] != "user":
        raise RecordError(f"{NEEDS}; this one ends with a {last['role']!r} turn")
    check_turns([*messages, {"role": "assistant", "content": "the reply"}])
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_prompts(file: Path) -> list[list[dict[str, str]]]:
    """Every prompt of `file`, or one error naming every bad line (the first ten, and how many)."""
    conversations, bad = [], []
    for record, origin in iter_raw_records(file):
        try:
            conversations.append(prompt_messages(record))
        except RecordError as error:
            bad.append(f"{origin}: {error}")
    if bad:
        more = f"\n  ... and {len(bad) - MOST_NAMED} more" if len(bad) > MOST_NAMED else ""
        listed = "\n  ".join(bad[:MOST_NAMED])
        raise DataError(f"{len(bad)} bad prompt record(s) in {file}:\n  {listed}{more}")
    if not conversations:
        raise DataError(f"{file}: no prompts")
    return conversations


def prompt_generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    """The random stream of the prompt at `index` (a CPU generator takes 32 bits of a seed)."""
    state = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
    return torch.Generator(device=device).manual_seed(state)


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def replies(
    model: Decoder,
    tokenizer,
    conversations: list[list[dict[str, str]]],
    *,
    batch_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
    top_k: int = 0,
    advance: Callable[[int], None] = lambda _: None,
) -> Iterator[str]:
    """The model's reply to each conversation, in order, `batch_size` conversations at once."""
    stop = stop_ids(tokenizer)
    device = model.lm_head.weight.device
    for start, batch in enumerate(batches(conversations, batch_size)):
        first = start * batch_size
        # one generator per prompt: its reply does not depend on the batch size
        generators = [prompt_generator(seed, first + row, device) for row in range(len(batch))]
        prompts = [prompt_ids(tokenizer, messages) for messages in batch]
        answers = generate(
            model, prompts, max_new_tokens, stop, temperature, generators, top_p, top_k
        )
        yield from (tokenizer.decode(reply, skip_special_tokens=True) for reply in answers)
        advance(len(batch))


def write_replies(
    model: Decoder,
    tokenizer,
    conversations: list[list[dict[str, str]]],
    out: Path,
    **sampling: Any,
) -> int:
    """Each conversation with the model's reply appended, one JSON line each, in order; returns
    the number written (`sampling`: as `replies` takes it). Written to a temporary file that
    replaces `out` only when complete."""
    partial = out.with_name(out.name + ".partial")
    written = empty = 0
    try:
        with partial.open("w") as handle:
            answered = replies(model, tokenizer, conversations, **sampling)
            for messages, text in zip(conversations, answered, strict=True):
                if not text.strip():  # training refuses an empty turn
                    empty += 1
                    continue
                turns = [*messages, {"role": "assistant", "content": text}]
                handle.write(json.dumps({"messages": turns}, ensure_ascii=False) + "\n")
                written += 1
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if empty:
        log.warning(
            "%d of %d prompts got an empty reply and were left out (training refuses an empty "
            "turn): raise --max-new-tokens, or sample with --temperature", empty, len(conversations),
        )  # fmt: skip
    partial.replace(out)
    return written
