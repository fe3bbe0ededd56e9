"""Metrics as JSON lines (one object per logged step or evaluation), TensorBoard scalars and the
configured trackers' (`trackers.py`)."""

import json
import logging
import time
from pathlib import Path
from typing import Any

from tuneforge.config import RunConfig
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import LoraShape, forward_flops_per_token, training_flops_per_token
from tuneforge.plan.frozen_models import forward_every_step
from tuneforge.runs.files import METRICS_FILE, TENSORBOARD_DIR, keep_through_step
from tuneforge.runs.pace import Pace
from tuneforge.train.device_watch import DeviceWatch
from tuneforge.train.progress import Progress
from tuneforge.train.trackers import open_trackers

log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(
        self, file: Path, tensorboard_dir: Path | None = None, trackers: list | None = None
    ) -> None:
        self.file = file
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.trackers = trackers or []
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

    @classmethod
    def of(cls, config: RunConfig, run_dir: Path) -> "MetricsLog":
        """The run's: `metrics.jsonl`, TensorBoard where configured, the trackers of report_to."""
        run_dir.mkdir(parents=True, exist_ok=True)
        logging_ = config.logging
        tensorboard = logging_.tensorboard or "tensorboard" in logging_.report_to
        board = run_dir / TENSORBOARD_DIR if tensorboard else None
        return cls(run_dir / METRICS_FILE, board, open_trackers(config, run_dir))

    def write(self, record: dict[str, Any]) -> None:
        with self.file.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if "step" not in record:
            return
        numbers = {
            key: float(value)
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
        if self.board is not None:
            for key, value in numbers.items():
                self.board.add_scalar(key, value, record["step"])
            self.board.flush()
        for tracker in self.trackers:
            tracker.log(numbers, record["step"])

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resumed run logs them again)."""
        keep_through_step(self.file, step)

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
        for tracker in self.trackers:
            tracker.close()


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


class StepLog:
    """Each step's numbers read from the device, counted into the run's progress and written as
    a metrics line (throughput, MFU, ETA, memory, clocks) every `logging.log_steps` steps."""

    def __init__(
        self,
        config: RunConfig,
        args: ModelArgs,
        lora: LoraShape | None,
        world_size: int,
        total_steps: int,
        metrics: MetricsLog | None,
        device_watch: DeviceWatch,
        peak_tflops: float | None,
    ) -> None:
        self.config, self.args, self.lora, self.world_size = config, args, lora, world_size
        self.total_steps, self.metrics, self.device_watch = total_steps, metrics, device_watch
        self.peak_tflops = peak_tflops
        self.frozen_forwards = forward_every_step(config, args)
        """Shapes of the frozen models run each step (a reference, a teacher): their FLOPs count
        in MFU as the planner and the benchmark count them."""
        self.pace = Pace()
        self.started = time.time()

    def elapsed(self, progress: Progress) -> float:
        """Seconds the run has taken, earlier jobs included."""
        return progress.elapsed_before + time.time() - self.started

    def record(
        self, result: dict[str, Any], step: int, step_s: float, progress: Progress
    ) -> dict[str, Any]:
        self.pace.add(step_s)
        progress.tokens_seen += result["tokens"]
        if result["finite"]:
            progress.nonfinite_in_row = 0
        else:
            progress.nonfinite_steps += 1
            progress.nonfinite_in_row += 1
            log.warning("step %d: non-finite loss or gradient norm; update skipped", step)
        length = round(result["mean_doc_len"])
        flops = training_flops_per_token(self.args, length, self.lora) + sum(
            forward_flops_per_token(shape, length) for shape in self.frozen_forwards
        )
        record = step_record(
            step,
            result,
            step_s,
            tflops=result["tokens"] / step_s * flops / self.world_size / 1e12,
            peak_tflops=self.peak_tflops,
            elapsed_s=self.elapsed(progress),
            eta_s=self.pace.eta_s(self.total_steps - step),
            checkpoint_s=progress.checkpoint_s,
            nonfinite_steps=progress.nonfinite_steps,
        )
        record |= result["metrics"] | self.device_watch.check(step)
        if self.metrics is not None and (
            step % self.config.logging.log_steps == 0 or step == self.total_steps
        ):
            self.metrics.write(record)
        return record
