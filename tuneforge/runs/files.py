"""The run directory's fixed names and the metrics file's reader. Everything that reads or
writes a run directory takes its names from here."""

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from tuneforge.errors import TuneforgeError

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
"""GRPO's sampled completions with their prompts and rewards, a few each logging step."""
FINISHED_FILE = "finished"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
"""In `CHECKPOINTS`: a JSON pointer to the newest complete checkpoint."""
STATE_FILE = "state.json"
"""In a checkpoint: the loop's state; a checkpoint without it is incomplete."""
WEIGHTS_DIR = "dcp"
FINAL_DIR = "final"
ADAPTER_DIR = "adapter"
BASE_DIR = "base"
JOBS_FILE = "jobs.jsonl"
"""One line per finished job of a SLURM chain."""
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    COMPLETIONS_FILE,
    FINISHED_FILE,
    TENSORBOARD_DIR,
    CHECKPOINTS,
    FINAL_DIR,
    ADAPTER_DIR,
    BASE_DIR,
    JOBS_FILE,
)
"""What runs write in their directory: all that `--overwrite` removes."""
SET_ASIDE_DIR = ".replaced"
"""Where `--overwrite` keeps the previous run until the new one has set itself up."""


def read_metrics(file: Path) -> list[dict[str, Any]]:
    """The records of a metrics file. A last line cut short (a run writing it, or killed while
    it did) is left out; any other line that is not JSON is an error naming it."""
    lines = file.read_text(encoding="utf-8").split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as error:
            if number == len(lines):  # no newline after it: cut short
                log.warning(
                    "%s: its last line is cut short (a run writing it, or one killed while it "
                    "did) and is left out",
                    file,
                )
                break
            raise TuneforgeError(f"{file}, line {number}: not a JSON record ({error})") from None
    return records


def keep_through_step(file: Path, step: int) -> None:
    """Drop the records of a JSON-lines file (metrics, completions) of steps after `step`: a
    resumed run writes them again."""
    if file.is_file():
        kept = [r for r in read_metrics(file) if r.get("step", 0) <= step]
        file.write_text("".join(json.dumps(r) + "\n" for r in kept))


def read_run_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A run's metrics records and its saved configuration, or a clear error."""
    file = run_dir / METRICS_FILE
    if not file.is_file():
        raise TuneforgeError(f"{run_dir} has no {METRICS_FILE}: is it a run directory?")
    records = read_metrics(file)
    if not records:
        raise TuneforgeError(f"{file} is empty: the run has logged no step yet")
    config_file = run_dir / CONFIG_FILE
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else None
    return records, config or {}


def is_finished(run_dir: Path) -> bool:
    return (run_dir / FINISHED_FILE).is_file()
