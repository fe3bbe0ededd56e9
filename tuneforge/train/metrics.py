"""Metrics as JSON lines (one object per logged step or evaluation) and TensorBoard scalars,
and the pace of the run: steady-state step time, ETA and projected total time."""

import json
import logging
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WARMUP_STEPS = 3
"""Steps left out of the steady-state step time (compilation, allocator warm-up)."""


class MetricsLog:
    def __init__(self, file: Path, tensorboard_dir: Path | None = None) -> None:
        self.file = file
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.board = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(
                    "tensorboard is not installed: no event files (pip install tensorboard)"
                )
            else:
                self.board = SummaryWriter(str(tensorboard_dir))

    def write(self, record: dict[str, Any]) -> None:
        with self.file.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.board is not None and "step" in record:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self.board.add_scalar(key, value, record["step"])
            self.board.flush()

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resumed run logs them again)."""
        if self.file.is_file():
            kept = [r for r in read_metrics(self.file) if r.get("step", 0) <= step]
            self.file.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def step_record(
    step: int,
    result: dict[str, Any],
    step_s: float,
    *,
    tflops: float,
    peak_tflops: float | None,
    elapsed_s: float,
    eta_s: float | None,
    checkpoint_s: float | None,
    nonfinite_steps: int,
) -> dict[str, Any]:
    """A training step's metrics line: `result` (the step's numbers read from the device),
    its period `step_s`, and `tflops` of useful work per GPU per second."""
    return {
        "step": step,
        "loss": result["loss"],
        "lr": result["lr"],
        "grad_norm": result["grad_norm"],
        "tokens": result["tokens"],
        "loss_tokens": result["loss_tokens"],
        "tokens_per_s": result["tokens"] / step_s,
        "loss_tokens_per_s": result["loss_tokens"] / step_s,
        "tflops": tflops,
        "mfu": tflops / peak_tflops if peak_tflops else None,
        "step_s": step_s,
        "elapsed_s": elapsed_s,
        "eta_s": eta_s,
        "checkpoint_s": checkpoint_s,
        "nonfinite_steps": nonfinite_steps,
    }


def read_metrics(file: Path) -> list[dict[str, Any]]:
    with file.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Pace:
    """Step times of this job; the steady state is their mean after the first few. Packed
    batches differ in cost (one holding a long document pays much more attention), so N steps
    take N times the mean; a median would count only the common, cheaper batches."""

    def __init__(self) -> None:
        self.step_times: list[float] = []

    def add(self, seconds: float) -> None:
        self.step_times.append(seconds)

    @property
    def steady_step_s(self) -> float | None:
        settled = self.step_times[WARMUP_STEPS:] or self.step_times
        return statistics.fmean(settled) if settled else None

    def eta_s(self, remaining_steps: int) -> float | None:
        step = self.steady_step_s
        return None if step is None else step * remaining_steps
