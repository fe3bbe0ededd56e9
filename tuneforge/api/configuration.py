"""`tuneforge.config(...)`: a run configuration from a YAML file or a mapping, with overrides,
checked by the same rules and with the same messages as `tuneforge config validate`."""

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneforge.config import ConfigIssue, RunConfig, load_config
from tuneforge.config.loading import load_config_mapping, reload_config, without_data

ConfigLike = RunConfig | str | Path | Mapping[str, Any]
"""A configuration as the API takes it: loaded, a YAML file, or a mapping of sections."""


def config(source: ConfigLike, *overrides: str, **settings: Any) -> RunConfig:
    """The run configuration in `source` (a YAML file, a mapping of sections, or a loaded one),
    with `overrides` (`"train.lr=1e-4"`) and `settings` (`train__lr=1e-4`: `__` for the dot)
    applied in that order. Raises `ConfigError` listing every problem, each with its field,
    file:line and fix."""
    changes = [*overrides, *(_override(key, value) for key, value in settings.items())]
    if isinstance(source, RunConfig):
        return reload_config(source, changes) if changes else source
    if isinstance(source, Mapping):
        return load_config_mapping(source, changes)
    return load_config(Path(source), changes)


@dataclass
class Validation:
    """A configuration `train` would start: what this machine lacks to run it, and advice."""

    config: RunConfig
    machine_issues: list[ConfigIssue]
    """What this machine cannot do as configured (a package, a tracker, FP8 cores): the
    configuration is valid, run it elsewhere or change it."""
    advisories: list[str]


def validate(source: ConfigLike, *, with_data: bool = True) -> Validation:
    """Check a configuration as `train` checks it before any weights load: its rules, then the
    preflight (mesh sizes against the model's config.json, the tokenizer, the data, reward
    functions; `with_data=False` skips those that read the tokenizer and the data). Raises
    `ConfigError` listing every problem; this machine's are returned instead."""
    from tuneforge.config import advisories
    from tuneforge.config.errors import ConfigError
    from tuneforge.config.hub import without_weights

    with without_weights():
        loaded = config(source)
    from tuneforge.train.preflight import Inputs, issues_of

    inputs = Inputs(loaded)
    found = issues_of(inputs, with_data, machine=False)
    if found:
        raise ConfigError(found, str(source) if isinstance(source, str | Path) else "")
    return Validation(loaded, issues_of(inputs, machine=True), advisories(loaded))


def _override(key: str, value: Any) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value)
    return f"{key.replace('__', '.')}={text}"


@contextlib.contextmanager
def reading(with_data: bool) -> Iterator[None]:
    """Configurations read for a plan: a hub model's configuration without its weights, and,
    without the data, neither the data files nor a tokenizer."""
    from tuneforge.config.hub import without_weights

    with without_weights(), without_data() if not with_data else contextlib.nullcontext():
        yield
