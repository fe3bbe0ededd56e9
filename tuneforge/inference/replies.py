"""Answer a whole file of prompts with a model, in batches, and write the conversations as an SFT
dataset in the openai messages format: sequence-level distillation (a teacher's replies become
a student's training data)."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.data.records import DataError, RecordError, iter_raw_records
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import generate


def prompt_messages(record: object) -> list[dict[str, str]]:
    """The conversation to answer: `{"prompt": text}`, or `{"messages": [...]}` ending with a user
    turn (a final assistant turn, as in an SFT file, is left out and answered anew)."""
    if isinstance(record, RecordError):
        raise record
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    if isinstance(record.get("prompt"), str) and record["prompt"].strip():
        return [{"role": "user", "content": record["prompt"]}]
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        if messages[-1].get("role") == "assistant":
            messages = messages[:-1]
        if messages and messages[-1].get("role") == "user":
            return [{"role": m["role"], "content": m["content"]} for m in messages]
    raise RecordError('needs "prompt" (a string) or "messages" ending with a user turn')


def read_prompts(file: Path) -> list[list[dict[str, str]]]:
    conversations = []
    for record, origin in iter_raw_records(file):
        try:
            conversations.append(prompt_messages(record))
        except RecordError as error:
            raise DataError(f"{origin}: {error}") from None
    if not conversations:
        raise DataError(f"{file}: no prompts")
    return conversations


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def write_replies(
    model: Decoder,
    tokenizer,
    conversations: list[list[dict[str, str]]],
    out: Path,
    *,
    batch_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
    top_k: int = 0,
    advance: Callable[[int], None] = lambda _: None,
) -> int:
    """Each conversation with the model's reply appended, one JSON line each, in order; returns
    the number written. Written to a temporary file that replaces `out` only when complete."""
    if not tokenizer.chat_template:
        raise TuneforgeError(
            f"{tokenizer.name_or_path}: the tokenizer has no chat template to render the prompts "
            "with: use a chat model's directory (or a run of one)"
        )
    stop = stop_ids(tokenizer)
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    partial = out.with_name(out.name + ".partial")
    written = 0
    with partial.open("w") as handle:
        for batch in batches(conversations, batch_size):
            prompts = [prompt_ids(tokenizer, messages) for messages in batch]
            replies = generate(
                model, prompts, max_new_tokens, stop, temperature, generator, top_p, top_k
            )
            for messages, reply in zip(batch, replies, strict=True):
                text = tokenizer.decode(reply, skip_special_tokens=True)
                answered = [*messages, {"role": "assistant", "content": text}]
                handle.write(json.dumps({"messages": answered}, ensure_ascii=False) + "\n")
                written += 1
            advance(len(batch))
    partial.replace(out)
    return written
