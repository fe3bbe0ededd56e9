"""Typed run configuration: schema, YAML loading with presets and overrides, cross-field rules."""

from tuneforge.config.advisories import advisories
from tuneforge.config.errors import ConfigError, ConfigIssue
from tuneforge.config.loading import dump_config, load_config
from tuneforge.config.schema import RunConfig

__all__ = ["ConfigError", "ConfigIssue", "RunConfig", "advisories", "dump_config", "load_config"]
