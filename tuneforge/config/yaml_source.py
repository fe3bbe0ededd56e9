"""Read YAML into plain dicts while remembering the file and line of every value.

A scalar holding `${VAR}` / `${VAR:default}` is read as an `EnvReference`, expanded from the
environment only once the command line's overrides have replaced what they replace
(`expand_references`): a value that is overridden is never interpolated. A plain scalar that is
one whole reference is typed as YAML would type the substituted text; anything else stays a string.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuneforge.config.errors import ConfigIssue

ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")
STR_TAG = "tag:yaml.org,2002:str"

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Location:
    """Where a value was set: a file and line, or a command-line override."""

    file: Path | None
    line: int = 0
    override: str = ""

    def __str__(self) -> str:
        if self.file is None:
            return f"override '{self.override}'"
        return f"{self.file}:{self.line}"

    @property
    def base_dir(self) -> Path:
        """The directory that relative paths set here resolve against."""
        return self.file.parent if self.file is not None else Path.cwd()


SourceMap = dict[KeyPath, Location]


@dataclass(frozen=True)
class EnvReference:
    """A scalar that names environment variables, not expanded yet."""

    text: str
    retype: bool
    """A plain (unquoted) scalar: its expansion is typed as YAML would type it."""
    location: Location


def dotted(path: KeyPath) -> str:
    return ".".join(str(part) for part in path)


def read_yaml(file: Path, issues: list[ConfigIssue]) -> tuple[Any, SourceMap]:
    """Parse one YAML file; problems are appended to `issues` (nothing raises)."""
    source_map: SourceMap = {}
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        issues.append(ConfigIssue("", f"config file not found: {file}", "check the path"))
        return None, source_map
    except (OSError, UnicodeDecodeError) as error:
        issues.append(ConfigIssue("", f"cannot read {file}: {error}", "check the file"))
        return None, source_map
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = " ".join(part for part in (error.context, error.problem) if part)
        issues.append(
            ConfigIssue(
                "", f"YAML syntax error: {problem}", "fix the YAML at this line", f"{file}:{line}"
            )
        )
        return None, source_map
    except yaml.YAMLError as error:
        issues.append(ConfigIssue("", f"YAML error: {error}", "fix the YAML", str(file)))
        return None, source_map
    finally:
        loader.dispose()
    if node is None:
        return {}, source_map
    converter = _NodeConverter(file, loader, source_map, issues)
    return converter.convert(node, ()), source_map


class _NodeConverter:
    def __init__(
        self, file: Path, loader: yaml.SafeLoader, source_map: SourceMap, issues: list[ConfigIssue]
    ):
        self.file = file
        self.loader = loader
        self.source_map = source_map
        self.issues = issues

    def convert(self, node: yaml.Node, path: KeyPath) -> Any:
        location = Location(self.file, node.start_mark.line + 1)
        self.source_map[path] = location
        if isinstance(node, yaml.MappingNode):
            mapping: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(self.loader.construct_object(key_node))
                if key in mapping:
                    self.issues.append(
                        ConfigIssue(
                            dotted((*path, key)),
                            "key appears twice in the same mapping",
                            "keep one of them",
                            f"{self.file}:{key_node.start_mark.line + 1}",
                        )
                    )
                mapping[key] = self.convert(value_node, (*path, key))
            return mapping
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, index)) for index, item in enumerate(node.value)]
        if node.tag == STR_TAG and "${" in node.value:
            return EnvReference(node.value, node.style is None, location)
        return self.loader.construct_object(node, deep=True)


def expand_references(value: Any, path: KeyPath, issues: list[ConfigIssue]) -> Any:
    """`value` with every `EnvReference` in it expanded (an unset variable is an issue)."""
    if isinstance(value, EnvReference):
        return expand_env(value.text, value.retype, path, value.location, issues)
    if isinstance(value, dict):
        return {key: expand_references(item, (*path, key), issues) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_references(item, (*path, index), issues) for index, item in enumerate(value)]
    return value


def expand_env(
    text: str, retype: bool, path: KeyPath, location: Location, issues: list[ConfigIssue]
) -> Any:
    """Substitute `${VAR}` and `${VAR:default}`; retype a whole-value reference as YAML would."""

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name)
        if value is not None:
            return value
        if default is not None:
            return default
        issues.append(
            ConfigIssue(
                dotted(path),
                f"environment variable {name} is not set",
                f"export {name}=... before running, or give a default: ${{{name}:value}}",
                str(location),
            )
        )
        return match.group(0)

    expanded = ENV_REFERENCE.sub(substitute, text)
    if retype and ENV_REFERENCE.fullmatch(text) and expanded != text:
        try:
            return yaml.safe_load(expanded)
        except yaml.YAMLError:
            return expanded
    return expanded
