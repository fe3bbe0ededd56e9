"""Record formats, each turned into a `Conversation`: alpaca, squad, openai (alias messages),
sharegpt, text, preference (prompt, chosen, rejected: supervised training uses the chosen
reply; the rejected one is kept for preference training), unpaired (prompt, completion, label:
a reply labelled desirable or not, for KTO) and prompt (a prompt alone, for an objective that
samples its replies). `field_map` renames fields
(our name -> the name in the file)."""

import dataclasses
from collections.abc import Callable
from typing import Any

from tuneforge.data.records import Conversation, RecordError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


def _field(record: dict, name: str, field_map: dict[str, str], required: bool = True) -> object:
    key = field_map.get(name, name)
    if key not in record or record[key] is None:
        if required:
            raise RecordError(f'missing field "{key}"')
        return None
    return record[key]


def _text(record: dict, name: str, field_map: dict[str, str], required: bool = True) -> str | None:
    value = _field(record, name, field_map, required)
    if value is None:
        return None
    key = field_map.get(name, name)
    if not isinstance(value, str):
        raise RecordError(f'field "{key}" must be a string, not {type(value).__name__}')
    if required and not value.strip():
        raise RecordError(f'field "{key}" is empty')
    return value


def check_turns(messages: list[dict[str, str]], reply: bool = True) -> None:
    """Roles known, contents non-empty strings, system first, user and assistant taking turns;
    with `reply`, an assistant reply among them, else the user's turn last (a prompt)."""
    if not messages:
        raise RecordError("no messages")
    previous = None
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RecordError(f"{where} is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RecordError(f"{where}.role is {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise RecordError(f"{where}.content must be a string")
        if not content.strip():
            raise RecordError(f"{where}.content is empty")
        allowed = {
            None: {"system", "user"},
            "system": {"user"},
            "user": {"assistant"},
            "assistant": {"user", "tool"},
            "tool": {"tool", "assistant"},
        }[previous]
        if role not in allowed:
            after = f"after {previous!r}" if previous else "first"
            raise RecordError(
                f"{where}: role {role!r} cannot come {after} (expected {' or '.join(sorted(allowed))})"
            )
        previous = role
    if not reply:
        if previous != "user":
            raise RecordError("a prompt must end with the user's turn (the reply is sampled)")
        return
    if not any(message["role"] == "assistant" for message in messages):
        raise RecordError("no assistant message: nothing to learn from")


def _openai(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    raw = _field(record, "messages", field_map)
    if not isinstance(raw, list):
        raise RecordError(
            f'field "{field_map.get("messages", "messages")}" must be a list of messages'
        )
    messages: list[Any] = [
        {"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m
        for m in raw
    ]
    check_turns(messages)
    return Conversation(messages, origin)


def _alpaca(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    instruction = _text(record, "instruction", field_map)
    extra = _text(record, "input", field_map, required=False)
    output = _text(record, "output", field_map)
    system = _text(record, "system", field_map, required=False)
    prompt = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    messages: list[Any] = (
        [{"role": "system", "content": system}] if system and system.strip() else []
    )
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return Conversation(messages, origin)


def _squad(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    context = _text(record, "context", field_map)
    question = _text(record, "question", field_map)
    answers = _field(record, "answers", field_map)
    if isinstance(answers, dict):
        answers = answers.get("text")
    if isinstance(answers, str):
        answers = [answers]
    if (
        not isinstance(answers, list)
        or not answers
        or not isinstance(answers[0], str)
        or not answers[0].strip()
    ):
        raise RecordError(
            'field "answers" must hold at least one answer text ({"text": [...]} or a list)'
        )
    prompt = f"Context: {context}\n\nQuestion: {question}"
    return Conversation(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": answers[0]}], origin
    )


def _sharegpt(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    turns = _field(record, "conversations", field_map)
    if not isinstance(turns, list):
        raise RecordError(
            f'field "{field_map.get("conversations", "conversations")}" must be a list of turns'
        )
    messages: list[Any] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RecordError(f"conversations[{index}] is not an object")
        speaker = turn.get("from")
        if speaker not in SHAREGPT_ROLES:
            raise RecordError(
                f"conversations[{index}].from is {speaker!r}; expected one of {', '.join(SHAREGPT_ROLES)}"
            )
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
    try:
        check_turns(messages)
    except RecordError as error:
        raise RecordError(str(error).replace("messages[", "conversations[")) from None
    return Conversation(messages, origin)


def _prompt_messages(value: object, key: str) -> list[Any]:
    if isinstance(value, str):
        if not value.strip():
            raise RecordError(f'field "{key}" is empty')
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return [
            {"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m
            for m in value
        ]
    raise RecordError(f'field "{key}" must be a string or a list of messages')


def _reply(value: object, key: str) -> str:
    """A chosen or rejected reply: a string, or messages whose last one is the assistant's."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        if value[-1].get("role") != "assistant":
            raise RecordError(f'the last message of "{key}" must be the assistant\'s reply')
        value = value[-1].get("content")
    if not isinstance(value, str) or not value.strip():
        raise RecordError(
            f'field "{key}" must be a non-empty reply (a string or messages ending with one)'
        )
    return value


def _preference(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    prompt = _prompt_messages(
        _field(record, "prompt", field_map), field_map.get("prompt", "prompt")
    )
    chosen = _reply(_field(record, "chosen", field_map), field_map.get("chosen", "chosen"))
    rejected = _reply(_field(record, "rejected", field_map), field_map.get("rejected", "rejected"))
    messages = [*prompt, {"role": "assistant", "content": chosen}]
    check_turns(messages)
    return Conversation(messages, origin, rejected=rejected)


def _unpaired(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    prompt = _prompt_messages(
        _field(record, "prompt", field_map), field_map.get("prompt", "prompt")
    )
    key = field_map.get("completion", "completion")
    completion = _reply(_field(record, "completion", field_map), key)
    label_key = field_map.get("label", "label")
    label = _field(record, "label", field_map)
    if not isinstance(label, bool):
        raise RecordError(
            f'field "{label_key}" must be true (a reply to learn) or false (one to avoid), '
            f"not {label!r}"
        )
    messages = [*prompt, {"role": "assistant", "content": completion}]
    check_turns(messages)
    return Conversation(messages, origin, desirable=label)


def _prompt(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    key = field_map.get("prompt", "prompt")
    messages = _prompt_messages(_field(record, "prompt", field_map), key)
    try:
        check_turns(messages, reply=False)
    except RecordError as error:
        raise RecordError(f'field "{key}": {error}') from None
    return Conversation(messages, origin, is_prompt=True)


def _text_format(record: dict, field_map: dict[str, str], origin: str) -> Conversation:
    return Conversation([], origin, text=_text(record, "text", field_map))


FORMAT_FIELDS = {
    "openai": ("messages",),
    "messages": ("messages",),
    "alpaca": ("instruction", "input", "output", "system"),
    "squad": ("context", "question", "answers"),
    "sharegpt": ("conversations",),
    "text": ("text",),
    "preference": ("prompt", "chosen", "rejected"),
    "unpaired": ("prompt", "completion", "label"),
    "prompt": ("prompt",),
}
"""The fields each format reads (our names): the record's others are kept beside it."""

FORMATS: dict[str, Callable[[dict, dict[str, str], str], Conversation]] = {
    "openai": _openai,
    "messages": _openai,
    "alpaca": _alpaca,
    "squad": _squad,
    "sharegpt": _sharegpt,
    "text": _text_format,
    "preference": _preference,
    "unpaired": _unpaired,
    "prompt": _prompt,
}


def to_conversation(
    record: object, format_name: str, field_map: dict[str, str], origin: str
) -> Conversation:
    """One raw record as a Conversation, or `RecordError` saying what is wrong with it."""
    if isinstance(record, RecordError):
        raise record
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    conversation = FORMATS[format_name](record, field_map, origin)
    read = {field_map.get(name, name) for name in FORMAT_FIELDS[format_name]}
    others = {key: value for key, value in record.items() if key not in read}
    return dataclasses.replace(conversation, fields=others) if others else conversation
