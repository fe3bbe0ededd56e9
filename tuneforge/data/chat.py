"""Render a conversation with the tokenizer's chat template and mark which tokens carry loss.

The mask is derived without `{% generation %}` markers: each assistant reply's characters are
found by rendering the conversation up to the reply (with the generation prompt) and through it,
and comparing the two strings; tokens are then mapped to characters through the tokenizer's
offsets. A reply's end-of-turn token is part of the reply, so it is trained.
"""

from dataclasses import dataclass

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
        through = tokenizer.apply_chat_template(messages[: index + 1], tokenize=False)
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


def tokenize_conversation(
    tokenizer, conversation: Conversation, train_on: str
) -> TokenizedConversation:
    """Token ids and loss mask of one conversation (or raw text document)."""
    if conversation.text is not None:
        return tokenize_text(tokenizer, conversation.text)
    text, spans = render_spans(tokenizer, conversation.messages, conversation.origin)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids: list[int] = encoding["input_ids"]
    if train_on == "all":
        return TokenizedConversation(input_ids, [True] * len(input_ids))
    if train_on == "last_assistant":
        spans = spans[-1:]
    mask = [False] * len(input_ids)
    for index, (start, _end) in enumerate(encoding["offset_mapping"]):
        mask[index] = any(span_start <= start < span_end for span_start, span_end in spans)
    return TokenizedConversation(input_ids, mask)
