"""What a run is checked for before any weights load and before its run directory is made,
past the configuration's own rules (`config/rules.py`, run as it loads). `tuneforge config
validate` and `plan` run the same list, and `train` before its setup, so a refusal says the
same thing each time and leaves nothing on disk."""

from typing import TYPE_CHECKING

from tuneforge.config.errors import ConfigError, ConfigIssue
from tuneforge.config.schema import RunConfig
from tuneforge.train.preflight.check import Check, Inputs
from tuneforge.train.preflight.data import data_issues
from tuneforge.train.preflight.machine import machine_issues
from tuneforge.train.preflight.mesh import mesh_issues
from tuneforge.train.preflight.rewards import record_field_issues, reward_function_issues
from tuneforge.train.preflight.tokenizer import tokenizer_issues

if TYPE_CHECKING:  # torch is imported only by the checks that need it
    from tuneforge.parallel.distributed import Dist

CHECKS = (
    Check("reward functions", "your reward modules", reward_function_issues),
    Check("reward arguments", "the data files", record_field_issues),
    Check("mesh sizes", "the model's config.json and the processes", mesh_issues),
    Check("tokenizer", "the tokenizer and the model's config.json", tokenizer_issues),
    Check("data", "the tokenizer and the data files", data_issues),
    Check("this machine", "installed packages, trackers, the GPU", machine_issues, machine=True),
)
DATA_CHECKS = ("reward arguments", "tokenizer", "data")
"""What `--no-data` leaves out."""


def preflight(
    config: RunConfig, world: "Dist | None" = None, source: str = "", with_data: bool = True
) -> Inputs:
    """Run every check; raise `ConfigError` listing every problem they find. Returns what they
    read (the tokenizer, the data) for the run to go on with. `world`: the processes of a
    `train` (None: `config validate` and `plan`, which join none)."""
    inputs = Inputs(config, world)
    issues = issues_of(inputs, with_data)
    if issues:
        raise ConfigError(issues, source)
    return inputs


def issues_of(
    inputs: Inputs, with_data: bool = True, machine: bool | None = None
) -> list[ConfigIssue]:
    """The problems the `checks(with_data, machine)` find."""
    return [issue for check in checks(with_data, machine) for issue in check.run(inputs)]


def checks(with_data: bool = True, machine: bool | None = None) -> list[Check]:
    """The checks to run: with or without those that read the data, and only those about this
    machine (True) or only the others (False)."""
    return [
        check
        for check in CHECKS
        if (with_data or check.name not in DATA_CHECKS)
        and (machine is None or check.machine == machine)
    ]


__all__ = ["CHECKS", "Check", "Inputs", "checks", "issues_of", "preflight"]
