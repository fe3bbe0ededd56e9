"""The run directory's fixed names, the metrics file's reader, and where the newest complete
checkpoint lies. Everything that reads or writes a run directory takes its names from here."""

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


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint: the `latest` pointer, else the highest complete step."""
    root = run_dir / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        try:
            candidate = root / json.loads(pointer.read_text())["path"]
        except (json.JSONDecodeError, KeyError):
            candidate = None
        if candidate is not None and (candidate / STATE_FILE).is_file():
            return candidate
    complete = [p for p in root.glob("step_*") if (p / STATE_FILE).is_file()]
    return max(complete, key=lambda p: int(p.name.split("_")[1]), default=None)


def is_finished(run_dir: Path) -> bool:
    return (run_dir / FINISHED_FILE).is_file()
