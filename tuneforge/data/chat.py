"""Render a conversation with the tokenizer's chat template and mark which tokens carry loss.

The mask is derived without `{% generation %}` markers: each assistant reply's characters are
found by rendering the conversation up to the reply (with the generation prompt) and through it,
and comparing the two strings; tokens are then mapped to characters through the tokenizer's
offsets. A reply's end-of-turn token is part of the reply, so it is trained.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tuneforge.data.records import Conversation, DataError


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[bool]
    """True where the token is a target: predicted from the tokens before it."""


def render_spans(tokenizer, messages: list[dict], origin: str) -> tuple[str, list[tuple[int, int]]]:
    """The full rendered text and the character span of every assistant reply."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(
            messages[:index], tokenize=False, add_generation_prompt=True
        )
        last = index == len(messages) - 1
        through = (
            full if last else tokenizer.apply_chat_template(messages[: index + 1], tokenize=False)
        )
        if not (through.startswith(before) and full.startswith(through)):
            raise DataError(
                f"{origin}: the chat template does not render this conversation incrementally; "
                "assistant tokens cannot be located (use a template whose renders are prefixes)"
            )
        spans.append((len(before), len(through)))
    return full, spans


def tokenize_text(tokenizer, text: str) -> TokenizedConversation:
    """Raw text: the tokenizer's own special tokens, then an end-of-sequence token; all trained."""
    input_ids = list(tokenizer(text)["input_ids"])
    if tokenizer.eos_token_id is not None and (
        not input_ids or input_ids[-1] != tokenizer.eos_token_id
    ):
        input_ids.append(tokenizer.eos_token_id)
    return TokenizedConversation(input_ids, [True] * len(input_ids))


def pretokenized(tokenizer, conversation: Conversation) -> TokenizedConversation:
    """A document that came tokenised, checked against the tokenizer's vocabulary."""
    assert conversation.pretokenized is not None
    ids, mask = conversation.pretokenized
    if len(ids) and (int(ids.max()) >= len(tokenizer) or int(ids.min()) < 0):
        bad = int(ids.max()) if int(ids.max()) >= len(tokenizer) else int(ids.min())
        raise DataError(
            f"{conversation.origin}: token id {bad} is outside the tokenizer's vocabulary "
            f"(0..{len(tokenizer) - 1}): the data was tokenised with another tokenizer"
        )
    return TokenizedConversation(ids.tolist(), mask.astype(bool).tolist())


def tokenize_conversation(
    tokenizer, conversation: Conversation, train_on: str
) -> TokenizedConversation:
    """Token ids and loss mask of one conversation (or raw text document)."""
    return next(tokenize_conversations(tokenizer, [conversation], train_on))


def tokenize_conversations(
    tokenizer, conversations: list[Conversation], train_on: str, batch_size: int = 1024
) -> Iterator[TokenizedConversation]:
    """Token ids and loss masks of many records: rendered one by one, tokenised a batch at a
    time (a fast tokenizer encodes a batch on all cores)."""
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start : start + batch_size]
        rendered = [
            render_spans(tokenizer, c.messages, c.origin)
            if c.text is None and c.pretokenized is None
            else None
            for c in chunk
        ]
        texts = [render[0] for render in rendered if render is not None]
        batch = (
            tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
            if texts
            else None
        )
        position = 0
        for conversation, render in zip(chunk, rendered, strict=True):
            if conversation.pretokenized is not None:
                yield pretokenized(tokenizer, conversation)
                continue
            if render is None:
                assert conversation.text is not None
                yield tokenize_text(tokenizer, conversation.text)
                continue
            assert batch is not None
            input_ids = batch["input_ids"][position]
            starts = np.array(
                [offset[0] for offset in batch["offset_mapping"][position]], dtype=np.int64
            )
            position += 1
            yield TokenizedConversation(input_ids, _loss_mask(starts, render[1], train_on).tolist())


def _loss_mask(token_starts: np.ndarray, spans: list[tuple[int, int]], train_on: str) -> np.ndarray:
    """True for tokens that start inside a trained reply's characters."""
    if train_on == "all":
        return np.ones(len(token_starts), dtype=np.bool_)
    if train_on == "last_assistant":
        spans = spans[-1:]
    mask = np.zeros(len(token_starts), dtype=np.bool_)
    for span_start, span_end in spans:
        mask |= (token_starts >= span_start) & (token_starts < span_end)
    return mask
