"""Load a run configuration: YAML files with `extends:` presets, then `a.b.c=value` overrides.

Every problem found (syntax, unknown keys, types, ranges, missing files, cross-field rules) is
collected and raised together as one `ConfigError`.
"""

import contextlib
import contextvars
import copy
import glob
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

# the rule modules register their rules on import
import tuneforge.config.adapter_rules
import tuneforge.config.model_directories
import tuneforge.config.precision_rules  # noqa: F401
from tuneforge.config.errors import ConfigError, ConfigIssue
from tuneforge.config.hub import HubError, HubName, looks_like_hub_id, resolve_snapshot
from tuneforge.config.rules import check_rules
from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.base import RelativeToConfigFile, section_type
from tuneforge.config.validation_messages import describe_validation_error, unknown_key_issue
from tuneforge.config.yaml_source import (
    ENV_REFERENCE,
    KeyPath,
    Location,
    SourceMap,
    dotted,
    expand_env,
    expand_references,
    read_yaml,
)

EXTENDS_KEY = "extends"
DATA_FIELDS = ("data.train.", "data.eval.", "tokenizer.path")
"""What a plan without data (`plan --no-data`) neither reads nor needs."""
MAPPING_SOURCE = "the configuration mapping"
needs_data: contextvars.ContextVar[bool] = contextvars.ContextVar("needs_data", default=True)


@contextlib.contextmanager
def without_data() -> Iterator[None]:
    """Load configurations whose data files and tokenizer are not read: problems with those
    fields (a missing file, an unset variable, no tokenizer) are not reported."""
    token = needs_data.set(False)
    try:
        yield
    finally:
        needs_data.reset(token)


def load_config(file: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read, merge, override and validate; raise `ConfigError` listing every problem."""
    issues: list[ConfigIssue] = []
    raw, source_map = load_merged_yaml(Path(file), issues)
    if not isinstance(raw, dict):
        if raw is not None:
            issues.append(
                ConfigIssue("", "the top level must be a mapping of sections", location=str(file))
            )
        raise ConfigError(issues, str(file))
    return _validated(raw, source_map, overrides, issues, str(file))


def load_config_mapping(
    sections: Mapping[str, Any], overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """A configuration given as a mapping of sections (as the YAML would read), validated as a
    file is; its relative paths are read against the working directory."""
    if not isinstance(sections, Mapping):
        issue = ConfigIssue("", "the configuration must be a mapping of sections")
        raise ConfigError([issue], MAPPING_SOURCE)
    return _validated(copy.deepcopy(dict(sections)), {}, overrides, [], MAPPING_SOURCE)


def _validated(
    raw: dict,
    source_map: SourceMap,
    overrides: Iterable[str],
    issues: list[ConfigIssue],
    source: str,
) -> RunConfig:
    for override in overrides:
        apply_override(raw, source_map, override, issues)
    raw = expand_references(raw, (), issues)  # after the overrides: what they replace is gone
    resolve_input_paths(raw, source_map, RunConfig, (), issues)
    config = validate(raw, source_map, issues)
    if issues or config is None:
        raise ConfigError(issues, source)
    return config


def reload_config(config: RunConfig, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """`config` as it is now (its paths resolved), with more `overrides`: a what-if, a recipe."""
    return load_config_mapping(config.model_dump(mode="json", exclude_unset=True), overrides)


def load_merged_yaml(
    file: Path, issues: list[ConfigIssue], chain: tuple[Path, ...] = ()
) -> tuple[Any, SourceMap]:
    """Read `file` and the presets it extends (deep merge; lists replace; later wins)."""
    file = file.expanduser().resolve() if file.exists() else file
    if file in chain:
        cycle = " -> ".join(str(p) for p in (*chain, file))
        issues.append(
            ConfigIssue(EXTENDS_KEY, f"extends cycle: {cycle}", "remove one of the extends")
        )
        return {}, {}
    raw, source_map = read_yaml(file, issues)
    if not isinstance(raw, dict) or EXTENDS_KEY not in raw:
        return raw, source_map
    parents = expand_references(raw.pop(EXTENDS_KEY), (EXTENDS_KEY,), issues)
    parent_list = [parents] if isinstance(parents, str) else parents
    if not isinstance(parent_list, list) or not all(isinstance(p, str) for p in parent_list):
        issues.append(
            ConfigIssue(
                EXTENDS_KEY,
                "extends must be a path or a list of paths",
                "write extends: base.yaml",
                str(source_map.get((EXTENDS_KEY,), file)),
            )
        )
        return raw, source_map
    merged: dict[str, Any] = {}
    merged_map: SourceMap = {}
    for parent in parent_list:
        parent_file = (file.parent / parent).expanduser()
        if not parent_file.exists():
            issues.append(
                ConfigIssue(
                    EXTENDS_KEY,
                    f"preset not found: {parent_file}",
                    f"paths in extends resolve against {file.parent}",
                    str(source_map.get((EXTENDS_KEY,), file)),
                )
            )
            continue
        parent_raw, parent_map = load_merged_yaml(parent_file, issues, (*chain, file))
        if isinstance(parent_raw, dict):
            deep_merge(merged, merged_map, parent_raw, parent_map, ())
    deep_merge(merged, merged_map, raw, source_map, ())
    return merged, merged_map


def deep_merge(
    base: dict, base_map: SourceMap, top: dict, top_map: SourceMap, path: KeyPath
) -> None:
    """Merge `top` into `base` in place: mappings merge, everything else (lists too) replaces."""
    for key, value in top.items():
        key_path = (*path, key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], base_map, value, top_map, key_path)
            if key_path in top_map:
                base_map[key_path] = top_map[key_path]
            continue
        base[key] = value
        _replace_subtree(base_map, top_map, key_path)


def _replace_subtree(base_map: SourceMap, top_map: SourceMap, prefix: KeyPath) -> None:
    for key in [k for k in base_map if k[: len(prefix)] == prefix]:
        del base_map[key]
    for key, location in top_map.items():
        if key[: len(prefix)] == prefix:
            base_map[key] = location


def apply_override(
    raw: dict, source_map: SourceMap, override: str, issues: list[ConfigIssue]
) -> None:
    """Apply one `a.b.c=value` override; the value is typed as YAML would type it."""
    key, sep, text = override.partition("=")
    location = Location(None, override=override)
    if not sep or not key.strip():
        issues.append(
            ConfigIssue(
                "",
                f"override '{override}' is not of the form key=value",
                "write e.g. train.lr=2e-4",
            )
        )
        return
    path: KeyPath = tuple(part for part in key.strip().split("."))
    if any(not part for part in path):
        issues.append(
            ConfigIssue(
                key, "empty part in a dotted key", "write e.g. train.lr=2e-4", str(location)
            )
        )
        return
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as error:
        issues.append(
            ConfigIssue(key, f"cannot parse the value: {error}", "quote it", str(location))
        )
        return
    if isinstance(value, str) and "${" in value:
        value = expand_env(value, True, path, location, issues)
    path = _with_list_indices(raw, path)
    node: Any = raw
    for depth, part in enumerate(path):
        if isinstance(node, list) and not isinstance(part, int):
            issues.append(
                ConfigIssue(
                    key,
                    f"{dotted(path[:depth])} is a list of {len(node)} item{'s' if len(node) != 1 else ''}; {part!r} is none of "
                    "its indices",
                    f"name an item by its index, 0 to {len(node) - 1}, or replace the whole list "
                    f"({dotted(path[:depth])}=[...])",
                    str(location),
                )
            )
            return
        if depth == len(path) - 1:
            break
        if isinstance(node, dict) and not isinstance(node.get(part), dict | list):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value
    _replace_subtree(source_map, {}, path)
    source_map[path] = location
    if isinstance(value, dict | list):
        _mark_subtree(source_map, value, path, location)


def _with_list_indices(raw: dict, path: KeyPath) -> KeyPath:
    """`path` with the parts that index an existing list (`data.train.0.path`) as integers."""
    found: list[str | int] = []
    node: Any = raw
    for part in path:
        if isinstance(node, list) and str(part).isdigit() and int(part) < len(node):
            found.append(int(part))
            node = node[int(part)]
            continue
        found.append(part)
        node = node.get(part) if isinstance(node, dict) else None
    return tuple(found)


def _mark_subtree(source_map: SourceMap, value: Any, path: KeyPath, location: Location) -> None:
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        source_map[(*path, key)] = location
        if isinstance(child, dict | list):
            _mark_subtree(source_map, child, (*path, key), location)


def resolve_input_paths(
    raw: Any,
    source_map: SourceMap,
    model: type[BaseModel],
    path: KeyPath,
    issues: list[ConfigIssue],
) -> None:
    """Make relative input paths absolute against the file that set them; report missing ones."""
    if not isinstance(raw, dict):
        return
    for name, field in model.model_fields.items():
        if name not in raw or raw[name] is None:
            continue
        key_path = (*path, name)
        if isinstance(raw[name], str) and ENV_REFERENCE.search(raw[name]):
            continue  # its unset variable is the problem, reported where it was expanded
        hub = next((meta for meta in _metadata(field) if isinstance(meta, HubName)), None)
        if hub is not None and isinstance(raw[name], str):
            _resolve_hub(raw, name, key_path, source_map, issues, hub.repo_type)
            continue
        marker = _input_path_marker(field)
        if marker is not None:
            if (
                isinstance(raw[name], str)
                and marker.hub
                and _names_the_hub(raw[name], key_path, source_map)
            ):
                _resolve_hub(raw, name, key_path, source_map, issues)
            elif isinstance(raw[name], str):
                raw[name] = str(_resolve_one(raw[name], key_path, source_map, issues))
            continue
        section = section_type(field.annotation)
        if section is None:
            continue
        from_string = getattr(section, "from_string", None)
        if from_string is not None and isinstance(raw[name], str):
            raw[name] = from_string(raw[name])
            location = source_map.get(key_path)
            if location is not None:
                source_map.update({(*key_path, key): location for key in raw[name]})
        if isinstance(raw[name], list):
            for index, item in enumerate(raw[name]):
                resolve_input_paths(item, source_map, section, (*key_path, index), issues)
        else:
            resolve_input_paths(raw[name], source_map, section, key_path, issues)


def _metadata(field: Any) -> list:
    """The field's annotation metadata, on it or inside its `X | None` annotation."""
    metadata = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        metadata += getattr(arg, "__metadata__", ())
    return metadata


def _input_path_marker(field: Any) -> RelativeToConfigFile | None:
    return next((m for m in _metadata(field) if isinstance(m, RelativeToConfigFile)), None)


def _names_the_hub(text: str, path: KeyPath, source_map: SourceMap) -> bool:
    """A hub id, and neither a file or directory of that name beside the config nor a directory
    named as its organisation (`models/llama-3-8b` where `models/` exists is a mistyped path)."""
    if not looks_like_hub_id(text):
        return False
    location = source_map.get(path, Location(None, override=dotted(path)))
    local = location.base_dir / text
    return not (local.exists() or local.parent.is_dir())


def _resolve_hub(
    raw: dict,
    name: str,
    path: KeyPath,
    source_map: SourceMap,
    issues: list[ConfigIssue],
    repo_type: str = "model",
) -> None:
    """The hub id's snapshot directory in the section's `path` (a model's: in place of the id),
    its commit in the section's `revision`."""
    location = source_map.get(path, Location(None, override=dotted(path)))
    if name != "path" and raw.get("path") is not None:
        if raw.get("revision") and Path(raw["path"]).is_dir():
            return  # resolved before: a run's config.yaml records the snapshot and its commit
        issues.append(
            ConfigIssue(
                dotted(path), f"both {name} and path are given", f"keep one of {name} and path",
                str(location),
            )
        )  # fmt: skip
        return
    try:
        folder, commit = resolve_snapshot(raw[name], raw.get("revision"), repo_type)
    except HubError as error:
        what, fix = error.what, error.fix
        if name == "path":  # `models/llama-3-8b` may as well be a local directory's path
            local = (location.base_dir / raw[name]).resolve()
            what = f"no such directory: {local}; read as a hub id, {raw[name]}: {what}"
            fix = f"a local model: check the path (a relative one resolves against {location.base_dir}); a hub id: {fix}"
        issues.append(ConfigIssue(dotted(path), what, fix, str(location)))
        return
    raw["path"], raw["revision"] = str(folder), commit


def _resolve_one(
    text: str, path: KeyPath, source_map: SourceMap, issues: list[ConfigIssue]
) -> Path:
    location = source_map.get(path, Location(None, override=dotted(path)))
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        candidate = (location.base_dir / candidate).resolve()
    if any(char in text for char in "*?["):
        matched = glob.glob(str(candidate), recursive=True)
        if not matched:
            issues.append(
                ConfigIssue(
                    dotted(path),
                    f"the pattern {candidate} matches no file",
                    f"check the pattern; a relative one resolves against {location.base_dir}",
                    str(location),
                )
            )
        return candidate
    if not candidate.exists():
        issues.append(
            ConfigIssue(
                dotted(path),
                f"no such file or directory: {candidate}",
                f"check the path; a relative path resolves against {location.base_dir}",
                str(location),
            )
        )
    return candidate


def validate(raw: dict, source_map: SourceMap, issues: list[ConfigIssue]) -> RunConfig | None:
    """Validate section by section so that one broken section does not hide the others."""
    sections: dict[str, BaseModel] = {}
    for key in raw:
        if key not in RunConfig.model_fields:
            issues.append(unknown_key_issue((key,), RunConfig, source_map))
    for name, field in RunConfig.model_fields.items():
        section_class = section_type(field.annotation)
        assert section_class is not None
        if name not in raw:
            if field.is_required():
                issues.append(
                    ConfigIssue(
                        name,
                        "required section is missing",
                        f"add a `{name}:` section ({field.description})",
                    )
                )
            else:
                sections[name] = section_class()
            continue
        try:
            sections[name] = section_class.model_validate(
                raw[name] if raw[name] is not None else {}
            )
        except ValidationError as error:
            for detail in error.errors():
                path: KeyPath = (name, *detail["loc"])
                issues.append(describe_validation_error(detail, path, section_class, source_map))
    issues.extend(check_rules(sections, source_map))
    if not needs_data.get():
        issues[:] = [issue for issue in issues if not f"{issue.path}.".startswith(DATA_FIELDS)]
    if issues or len(sections) != len(RunConfig.model_fields):
        return None
    return RunConfig(**sections)


def dump_config(config: RunConfig) -> str:
    """The resolved configuration as YAML, loadable again by `load_config`."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
