"""The progress of a training run shown as it goes: a rich progress bar in a terminal or a
Jupyter notebook, one plain line every `logging.log_steps` steps elsewhere (a log file), and
each evaluation as it is made."""

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

if TYPE_CHECKING:
    from tuneforge.api.run_start import RunStart
    from tuneforge.config import RunConfig
    from tuneforge.train.loop import Evaluation


class TrainingProgress:
    def __init__(self, config: "RunConfig", console: Console) -> None:
        self.config, self.console = config, console
        self.progress: Progress | None = None
        self.total, self.plain = 0, False
        self.headlines: list[Any] = []
        self.task: TaskID | None = None

    def start(self, start: "RunStart") -> None:
        from tuneforge.train.objectives.seam import objective_of

        self.total = start.total_steps
        self.headlines = [m for m in objective_of(start.objective).metrics if m.headline]
        shown = self.config.logging.progress and start.is_main
        self.plain = shown and not (self.console.is_terminal or self.console.is_jupyter)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  "
                "{task.fields[tps]:,.0f} tok/s{task.fields[headline]}"
            ),
            TimeRemainingColumn(),
            console=self.console,
            disable=not shown or self.plain,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=self.total, completed=start.resumed_from, loss=float("nan"), lr=0.0,
            tps=0.0, headline="",
        )  # fmt: skip

    def step(self, record: dict) -> None:
        assert self.progress is not None and self.task is not None
        shown = headline(record, self.headlines)
        self.progress.update(
            self.task, advance=1, loss=record["loss"], lr=record["lr"],
            tps=record["tokens_per_s"], headline=f"  {shown}" if shown else "",
        )  # fmt: skip
        step = record["step"]
        if self.plain and (step % self.config.logging.log_steps == 0 or step == self.total):
            line = plain_line(record, self.total)
            self.console.print(f"{line}  {shown}" if shown else line, markup=False, highlight=False)

    def evaluation(self, evaluation: "Evaluation", is_main: bool) -> None:
        if is_main and self.progress is not None and self.config.logging.progress:
            self.progress.console.print("eval: " + describe_evaluation(evaluation))

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def describe_evaluation(evaluation: "Evaluation") -> str:
    parts = [f"step {evaluation.step}"]
    if evaluation.loss is not None:
        parts.append(f"held-out loss {evaluation.loss.loss:.4f}")
        for metric in evaluation.loss.shown:
            if metric.headline:
                value = evaluation.loss.metrics[metric.name]
                parts.append(f"{metric.label} {metric.format(value)}")
    if evaluation.accuracy is not None:
        parts.append(f"exact match {evaluation.accuracy.accuracy:.1%}")
    return ", ".join(parts)


def headline(record: dict, metrics: list) -> str:
    """The objective's headline metrics of a step (GRPO's reward), as they are shown."""
    values = [(m, record.get(m.name)) for m in metrics]
    return "  ".join(f"{m.label} {m.format(v)}" for m, v in values if v is not None)


def plain_line(record: dict, total_steps: int) -> str:
    """One step's numbers for logs that are not a terminal."""
    parts = [
        f"step {record['step']}/{total_steps}",
        f"loss {record['loss']:.4f}",
        f"lr {record['lr']:.2e}",
        f"grad_norm {record['grad_norm']:.3f}",
        f"{record['tokens_per_s']:,.0f} tok/s",
    ]
    if record.get("mfu") is not None:
        parts.append(f"MFU {record['mfu']:.1%}")
    if record.get("mem_reserved_gib") is not None:
        parts.append(f"{record['mem_reserved_gib']:.1f} GiB reserved")
    if record.get("eta_s") is not None:
        parts.append(f"ETA {record['eta_s']:.0f} s")
    return "  ".join(parts)
