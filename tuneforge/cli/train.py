"""`tuneforge train`: run the trainer with a progress bar, and print what it achieved."""

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from tuneforge.api.run_start import RunStart
from tuneforge.cli.common import (
    EXIT_NONFINITE,
    ConfigArg,
    OverridesArg,
    console,
    setup_logging,
)
from tuneforge.config import load_config

if TYPE_CHECKING:
    from tuneforge.train.loop import TrainSummary


def train(
    config: ConfigArg,
    overrides: OverridesArg = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run directory.")] = False,
    resume: Annotated[
        str,
        typer.Option(
            help="never, auto (from the newest complete checkpoint, if any) or a checkpoint directory."
        ),
    ] = "never",
    force: Annotated[
        bool, typer.Option(help="Resume even if memory-critical settings changed.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Fine-tune a model as the configuration says. Exit code 0: finished; 75: stopped before a
    time limit or on a signal after saving (run the same command with --resume auto); 3: stopped
    on non-finite losses."""
    setup_logging(verbose)
    # SLURM's USR1 means "save and stop": the loop handles it; outside the loop (setup, the final
    # save) it must not kill the process
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    run_config = load_config(config, overrides or [])  # its mistakes before the heavy imports
    from tuneforge.api.training import train as run

    started: list[RunStart] = []

    def on_start(start: RunStart) -> None:
        started.append(start)
        if start.is_main:
            resumed = f"from step {start.resumed_from} " if start.resumed_from else ""
            console.print(
                f"run directory: {start.run_dir}  ({start.total_steps} steps {resumed}on "
                f"{start.processes} x {start.device}, {start.layout})"
            )

    summary = run(
        run_config, on_start=on_start, overwrite=overwrite, resume=resume, force=force,
        progress=console,
    )  # fmt: skip
    main = not started or started[0].is_main
    code = _report(summary, main)
    if summary.processes > 1:
        from tuneforge.parallel.distributed import exit_rank

        exit_rank(code)
    if code:
        raise typer.Exit(code)


def _report(summary: "TrainSummary", main: bool) -> int:
    """The exit code that says what the run did; the main rank prints it."""
    from tuneforge.runs.time_budget import EXIT_RESUME

    if summary.stopped in ("time limit", "signal"):
        if main:
            console.print(
                f"stopped at step {summary.steps} ({summary.stopped}) after saving a checkpoint: "
                "run the same command with --resume auto to continue"
            )
        return EXIT_RESUME
    if summary.stopped == "non-finite":
        if main:
            console.print(
                f"[red]stopped at step {summary.steps}: {summary.skipped_steps} step(s) with "
                "non-finite loss or gradients (train.on_nonfinite, train.max_nonfinite_steps)[/red]"
            )
        return EXIT_NONFINITE
    if main and not summary.finished_before:  # a finished run: the library has said so
        _print_summary(summary, summary.saved)
    return 0


def _print_summary(summary, saved: Path | None) -> None:
    console.print(f"finished {summary.steps} steps, last training loss {summary.final_loss:.4f}")
    if summary.skipped_steps:
        console.print(
            f"[yellow]{summary.skipped_steps} step(s) skipped for non-finite loss[/yellow]"
        )
    if len(summary.evaluations) >= 2:
        first, last = summary.evaluations[0], summary.evaluations[-1]
        table = Table("held-out", "before", "after")
        if first.loss is not None and last.loss is not None:
            table.add_row("loss", f"{first.loss.loss:.4f}", f"{last.loss.loss:.4f}")
            for metric in last.loss.shown:
                before = first.loss.metrics.get(metric.name)
                after = last.loss.metrics[metric.name]
                shown_before = "" if before is None else metric.format(before)
                table.add_row(metric.label, shown_before, metric.format(after))
        if first.accuracy is not None and last.accuracy is not None:
            table.add_row(
                f"exact match ({last.accuracy.num_total} prompts)",
                f"{first.accuracy.accuracy:.1%}",
                f"{last.accuracy.accuracy:.1%}",
            )
            for prompt, expected, got in last.accuracy.examples:
                mark = "[green]✓[/green]" if got == expected else "[red]✗[/red]"
                console.print(f"  {mark} {prompt!r} → {got!r} (expected {expected!r})")
        console.print(table)
    if saved is not None:
        console.print(f"saved: {saved}")
