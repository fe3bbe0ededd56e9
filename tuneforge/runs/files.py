"""The run directory's fixed names and the metrics file's reader. Everything that reads or
writes a run directory takes its names from here."""

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
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
    with file.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def is_finished(run_dir: Path) -> bool:
    return (run_dir / FINISHED_FILE).is_file()
