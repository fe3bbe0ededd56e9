"""Turn pydantic's validation errors into issues that name the field, the place and the fix."""

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from tuneforge.config.errors import ConfigIssue
from tuneforge.config.sections.base import section_type
from tuneforge.config.yaml_source import KeyPath, SourceMap, dotted

TYPE_FIXES = {
    "float": "write a number, e.g. 2e-4",
    "int": "write a whole number, e.g. 100",
    "bool": "write true or false",
    "string": "write a string",
    "list": "write a list, e.g. [a, b]",
    "dict": "write a mapping of keys to values",
    "model": "write a mapping of keys to values",
    "tuple": "write a list of the expected length",
    "path": "write a path",
}

BOUND_WORDS = {
    "greater_than": "greater than",
    "greater_than_equal": "at least",
    "less_than": "less than",
    "less_than_equal": "at most",
}


def describe_validation_error(
    detail: Mapping[str, Any], path: KeyPath, section: type[BaseModel], source_map: SourceMap
) -> ConfigIssue:
    """One pydantic error dict as a ConfigIssue with field path, location, message and fix."""
    kind = detail["type"]
    location = nearest_location(path, source_map)
    if kind == "extra_forbidden":
        return unknown_key_issue(path, _model_at(section, path[1:-1]), source_map)
    help_text = _help_text(section, path[1:])
    context = f" ({help_text})" if help_text else ""
    got = "" if kind == "missing" else f" (got {detail.get('input')!r})"
    message = f"{detail['msg']}{got}"
    return ConfigIssue(
        dotted(path), message, _fix(kind, detail.get("ctx") or {}) + context, location
    )


def _fix(kind: str, ctx: dict[str, Any]) -> str:
    if kind == "missing":
        return "add this field"
    if kind in BOUND_WORDS:
        limit = next(iter(ctx.values()), "")
        return f"set a value {BOUND_WORDS[kind]} {limit}"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', 'the listed values')}"
    if kind == "string_pattern_mismatch":
        return "use only letters, digits, '.', '_' and '-'"
    if kind in ("too_short", "too_long"):
        return "change the number of items"
    for prefix, fix in TYPE_FIXES.items():
        if kind.startswith(prefix):
            return fix
    return "correct the value"


def _model_at(model: type[BaseModel], path: KeyPath) -> type[BaseModel] | None:
    """The config class found by walking `path` (list indexes skipped) down from `model`."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        current = section_type(field.annotation) if field is not None else None
    return current


def _help_text(model: type[BaseModel], path: KeyPath) -> str:
    names = [
        part
        for part in path
        if isinstance(part, str) and not part.startswith(("function-", "tuple["))
    ]
    if not names:
        return ""
    parent = _model_at(model, tuple(names[:-1]))
    if parent is None or names[-1] not in parent.model_fields:
        return ""
    return parent.model_fields[names[-1]].description or ""


def unknown_key_issue(
    path: KeyPath, parent: type[BaseModel] | None, source_map: SourceMap
) -> ConfigIssue:
    """An unknown key, with the closest known key of its section as the fix."""
    known = list(parent.model_fields) if parent is not None else []
    close = difflib.get_close_matches(str(path[-1]), known, n=1)
    fix = f"did you mean '{close[0]}'?" if close else f"valid keys here: {', '.join(known)}"
    return ConfigIssue(dotted(path), "unknown key", fix, nearest_location(path, source_map))


def nearest_location(path: KeyPath, source_map: SourceMap) -> str:
    """Where `path`, or the closest enclosing key that was set, comes from."""
    for end in range(len(path), 0, -1):
        if path[:end] in source_map:
            return str(source_map[path[:end]])
    return ""
