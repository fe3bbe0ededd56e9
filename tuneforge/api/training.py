"""`tuneforge.train(...)`: a whole run, as `tuneforge train` runs it: the preflight, the run
directory, the steps with their evaluations, checkpoints and time limit, the final save."""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneforge.api.configuration import ConfigLike, config
from tuneforge.api.run_start import RunStart

if TYPE_CHECKING:
    from rich.console import Console

    from tuneforge.train.loop import Evaluation, TrainSummary

log = logging.getLogger(__name__)


def train(
    source: ConfigLike,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_eval: "Callable[[Evaluation], None] | None" = None,
    *,
    on_start: Callable[[RunStart], None] | None = None,
    overwrite: bool = False,
    resume: str = "never",
    force: bool = False,
    progress: "bool | Console" = False,
) -> "TrainSummary":
    """Fine-tune as the configuration says and return the run's summary: its directory, steps,
    losses, evaluations and the saved weights (`saved`; None when it stopped early: `stopped`
    says why, `time limit`, `signal` or `non-finite`). `on_step` gets each step's metrics (the
    metrics.jsonl record), `on_eval` each evaluation, `on_start` the run's plan once set up.
    `resume`: `never`, `auto` (the newest intact checkpoint) or a checkpoint directory;
    `overwrite` replaces a run directory. `progress=True` shows a progress bar (a console:
    on that console). Raises `ConfigError` (or another `TuneforgeError`) for what it refuses."""
    from tuneforge.runs.files import is_finished
    from tuneforge.runs.run_dir import check_resume
    from tuneforge.train.loop import Trainer

    run_config = config(source)
    check_resume(resume, overwrite)
    if resume != "never" and is_finished(run_config.run.directory):
        log.info("%s already finished: nothing to do", run_config.run.directory)
        return _finished(run_config.run.directory)
    shown = _progress(run_config, progress)
    losses: list[float] = []

    def step(record: dict[str, Any]) -> None:
        losses.append(record["loss"])
        if shown is not None:
            shown.step(record)
        if on_step is not None:
            on_step(record)

    def evaluation(result: "Evaluation") -> None:
        if shown is not None:
            shown.evaluation(result, trainer.world.is_main)
        if on_eval is not None:
            on_eval(result)

    trainer = Trainer(run_config, overwrite=overwrite, resume=resume, force=force)
    try:
        trainer.setup()
        start = RunStart(
            trainer.run_dir, trainer.total_steps, trainer.resumed_from, trainer.world.world_size,
            trainer.device.type, trainer.dims.describe(), trainer.world.is_main, trainer.objective,
        )  # fmt: skip
        if on_start is not None:
            on_start(start)
        if shown is not None:
            shown.start(start)
        try:
            summary = trainer.train(on_step=step, on_eval=evaluation)
        finally:
            if shown is not None:
                shown.stop()
        summary.losses = losses
        summary.processes = trainer.world.world_size
        if summary.stopped is None:
            summary.saved = trainer.save()
    finally:
        trainer.close()
    return summary


def _progress(run_config, progress):
    if progress is False:
        return None
    from rich.console import Console

    from tuneforge.api.progress import TrainingProgress

    return TrainingProgress(run_config, Console() if progress is True else progress)


def _finished(run_dir: Path) -> "TrainSummary":
    """The summary of a run finished before: its steps and losses as its metrics logged them."""
    from tuneforge.runs.files import ADAPTER_DIR, FINAL_DIR, read_run_metrics
    from tuneforge.train.loop import TrainSummary

    records, _ = read_run_metrics(run_dir)
    losses = [record["loss"] for record in records if "loss" in record]
    steps = max((record.get("step", 0) for record in records), default=0)
    saved = [run_dir / name for name in (FINAL_DIR, ADAPTER_DIR) if (run_dir / name).is_dir()]
    summary = TrainSummary(run_dir, steps, losses[-1] if losses else float("nan"))
    summary.losses, summary.saved = losses, saved[0] if saved else None
    summary.finished_before = True
    return summary
