"""What a training run is about to do, once set up: told to `train`'s `on_start`."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunStart:
    """What a run is about to do, once its setup is done."""

    run_dir: Path
    total_steps: int
    resumed_from: int
    """The step it continues from (0: a new run)."""
    processes: int
    device: str
    layout: str
    """The parallel layout in words (`single`, `fsdp 4`, `tp 2 × fsdp 2`, ...)."""
    is_main: bool
    objective: Any
    """The objective (`train.objective`) being optimised."""
