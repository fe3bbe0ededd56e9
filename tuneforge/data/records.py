"""Read conversation records from local files; every problem names the file and line."""

import json
from dataclasses import dataclass
from pathlib import Path

ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """A data file that cannot be used as it is."""


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, str]]
    origin: str
    """`file:line` the conversation came from."""


def read_openai_jsonl(file: Path) -> list[Conversation]:
    """Read `{"messages": [{"role", "content"}, ...]}` lines; raise one error listing the bad lines."""
    conversations: list[Conversation] = []
    problems: list[str] = []
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            origin = f"{file}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                problems.append(f"{origin}: invalid JSON ({error.msg} at column {error.colno})")
                continue
            problem = _check_messages(record)
            if problem:
                problems.append(f"{origin}: {problem}")
                continue
            conversations.append(Conversation(record["messages"], origin))
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise DataError(f"{len(problems)} bad record(s) in {file}:\n  {shown}{more}")
    if not conversations:
        raise DataError(f"{file} holds no records")
    return conversations


def _check_messages(record: object) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return 'expected an object with a "messages" list'
    messages = record["messages"]
    if not messages:
        return '"messages" is empty'
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            return f"{where} is not an object"
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            return f"{where}.role is {role!r}; expected one of {', '.join(ROLES)}"
        if not isinstance(content, str):
            return f"{where}.content must be a string"
        if not content.strip():
            return f"{where}.content is empty"
    if not any(message["role"] == "assistant" for message in messages):
        return "no assistant message: nothing to learn from"
    return ""
