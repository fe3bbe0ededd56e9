"""Render a conversation with the tokenizer's chat template and mark which tokens carry loss.

The mask is derived without `{% generation %}` markers. Each assistant reply starts where the
render of the conversation before it, with the generation prompt, ends. It ends where the render
through it ends, for templates whose renders are prefixes of each other. Templates that render a
reply differently once later turns follow (Qwen3 drops earlier turns' reasoning and adds an empty
`<think></think>` block to the last reply only) are handled by a marker appended to the reply's
text, found in the full render, plus the end-of-turn text the template writes after a reply.
A reply's end-of-turn token is trained; the whitespace the template writes after it (ChatML's
`\n`) is not: generation stops at the end-of-turn token. Tokens are mapped to characters through
the tokenizer's offsets.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tuneforge.config.sections.data import DataSection
from tuneforge.data.records import Conversation, DataError

MARKER = "\ue000tuneforge-reply-end\ue001"
"""Appended to a reply's text to find where the template puts its end (private-use characters:
no real text holds them)."""
EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")


@dataclass(frozen=True)
class Rendering:
    """How conversations become tokens and targets (the data section's settings)."""

    train_on: str = "assistant"
    empty_think: str = "train"
    """`train` or `mask` the empty `<think></think>` block a template writes before a reply."""
    date_string: str | None = None
    """The date templates that stamp today's (Llama 3.x) write instead."""

    @classmethod
    def of(cls, data: DataSection) -> "Rendering":
        return cls(data.train_on, data.empty_think, data.date_string)


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[bool]
    """True where the token is a target: predicted from the tokens before it."""
    error: str | None = None
    """Why the record could not be rendered (then nothing else is set)."""


def _render(
    tokenizer, messages: list[dict], rendering: Rendering, origin: str, prompt: bool = False
) -> str:
    extra = {"date_string": rendering.date_string} if rendering.date_string else {}
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=prompt, **extra
        )
    except Exception as error:  # the template's own refusal (raise_exception) or a Jinja error
        raise DataError(
            f"{origin}: the chat template cannot render this conversation ({error})"
        ) from None


def render_spans(
    tokenizer, messages: list[dict], origin: str, rendering: Rendering = Rendering()
) -> tuple[str, list[tuple[int, int]]]:
    """The full rendered text and the character span of every assistant reply."""
    full = _render(tokenizer, messages, rendering, origin)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], rendering, origin, prompt=True)
        if not full.startswith(before):
            raise DataError(
                f"{origin}: the chat template renders the turns before reply {index} differently "
                "once the reply follows; its tokens cannot be located (use a template whose "
                "renders of earlier turns do not depend on later ones)"
            )
        end = _reply_end(tokenizer, messages, index, full, rendering, origin)
        start = len(before)
        think = EMPTY_THINK.match(full, start, end)
        if rendering.empty_think == "mask" and think is not None:
            start = think.end()
        trimmed = len(full[start:end].rstrip())
        spans.append((start, start + trimmed))
    return full, spans


def _reply_end(
    tokenizer, messages: list[dict], index: int, full: str, rendering: Rendering, origin: str
) -> int:
    """Where reply `index` (with its end-of-turn text) ends in `full`."""
    if index == len(messages) - 1:
        return len(full)
    through = _render(tokenizer, messages[: index + 1], rendering, origin)
    if full.startswith(through):
        return len(through)
    marked = dict(messages[index], content=str(messages[index]["content"]) + MARKER)
    in_full = _render(
        tokenizer, [*messages[:index], marked, *messages[index + 1 :]], rendering, origin
    )
    last = _render(tokenizer, [*messages[:index], marked], rendering, origin)
    at = in_full.find(MARKER)
    if at < 0 or in_full != full[:at] + MARKER + full[at:]:
        raise DataError(
            f"{origin}: the chat template rewrites reply {index} in a way its tokens cannot be "
            "located in (use a template that keeps a reply's text)"
        )
    end_of_turn = last[last.find(MARKER) + len(MARKER) :]
    if not full.startswith(end_of_turn, at):
        raise DataError(
            f"{origin}: the chat template ends reply {index} differently when it is the last "
            "one; its end-of-turn tokens cannot be located"
        )
    return at + len(end_of_turn)


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
    tokenizer, conversation: Conversation, rendering: Rendering
) -> TokenizedConversation:
    """Token ids and loss mask of one conversation (or raw text document); raises `DataError`
    where the template cannot render it."""
    tokenized = next(tokenize_conversations(tokenizer, [conversation], rendering))
    if tokenized.error is not None:
        raise DataError(tokenized.error)
    return tokenized


def _rendered(tokenizer, conversation: Conversation, rendering: Rendering):
    """The render and reply spans of a conversation, None for text and pre-tokenised records,
    or the `DataError` that says why it cannot be rendered."""
    if conversation.text is not None or conversation.pretokenized is not None:
        return None
    try:
        if conversation.is_prompt:
            messages, origin = conversation.messages, conversation.origin
            return _render(tokenizer, messages, rendering, origin, prompt=True), []
        return render_spans(tokenizer, conversation.messages, conversation.origin, rendering)
    except DataError as error:
        return error


def tokenize_conversations(
    tokenizer, conversations: list[Conversation], rendering: Rendering, batch_size: int = 1024
) -> Iterator[TokenizedConversation]:
    """Token ids and loss masks of many records: rendered one by one, tokenised a batch at a
    time (a fast tokenizer encodes a batch on all cores). A record the template cannot render
    comes back with its `error` set."""
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start : start + batch_size]
        rendered = [_rendered(tokenizer, c, rendering) for c in chunk]
        texts = [render[0] for render in rendered if isinstance(render, tuple)]
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
            if isinstance(render, DataError):
                yield TokenizedConversation([], [], error=str(render))
                continue
            assert batch is not None
            input_ids = batch["input_ids"][position]
            starts = np.array(
                [offset[0] for offset in batch["offset_mapping"][position]], dtype=np.int64
            )
            position += 1
            mask = _loss_mask(starts, render[1], rendering.train_on)
            yield TokenizedConversation(input_ids, mask.tolist())


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


def prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` rendered with the chat template, ready for the assistant's reply."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_ids(tokenizer) -> set[int]:
    """The tokens a reply ends at."""
    return {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
