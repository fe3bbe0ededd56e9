"""`tuneforge train`: run the trainer with a progress bar, and print what it achieved."""

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tuneforge.cli.common import (
    EXIT_NONFINITE,
    ConfigArg,
    OverridesArg,
    console,
    setup_logging,
)
from tuneforge.config import load_config


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
    from tuneforge.runs.files import is_finished
    from tuneforge.runs.run_dir import check_resume
    from tuneforge.train.loop import Trainer

    check_resume(resume, overwrite)
    if resume != "never" and is_finished(run_config.run.directory):
        console.print(f"{run_config.run.directory} already finished: nothing to do")
        return
    trainer = Trainer(run_config, overwrite=overwrite, resume=resume, force=force)
    try:
        code = _train(trainer, run_config)
    finally:
        trainer.close()
    if trainer.world.world_size > 1:
        from tuneforge.parallel.distributed import exit_rank

        exit_rank(code)
    if code:
        raise typer.Exit(code)


def _train(trainer, run_config) -> int:
    from tuneforge.runs.time_budget import EXIT_RESUME
    from tuneforge.train.objectives.seam import objective_of

    trainer.setup()
    main = trainer.world.is_main
    if main:
        start = f"from step {trainer.resumed_from} " if trainer.resumed_from else ""
        console.print(
            f"run directory: {trainer.run_dir}  ({trainer.total_steps} steps {start}on "
            f"{trainer.world.world_size} x {trainer.device.type}, {trainer.dims.describe()})"
        )
    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  {task.fields[tps]:,.0f} tok/s"
            "{task.fields[headline]}"
        ),
        TimeRemainingColumn(),
        console=console,
        disable=not (run_config.logging.progress and main and console.is_terminal),
    )
    plain_lines = main and run_config.logging.progress and not console.is_terminal
    log_steps = run_config.logging.log_steps
    with progress:
        task = progress.add_task(
            "train",
            total=trainer.total_steps,
            completed=trainer.resumed_from,
            loss=float("nan"),
            lr=0.0,
            tps=0.0,
            headline="",
        )
        headlines = [m for m in objective_of(trainer.objective).metrics if m.headline]

        def on_step(record: dict) -> None:
            shown = _headline(record, headlines)
            progress.update(
                task,
                advance=1,
                loss=record["loss"],
                lr=record["lr"],
                tps=record["tokens_per_s"],
                headline=f"  {shown}" if shown else "",
            )
            step = record["step"]
            if plain_lines and (step % log_steps == 0 or step == trainer.total_steps):
                line = _plain_line(record, trainer.total_steps)
                console.print(f"{line}  {shown}" if shown else line, markup=False, highlight=False)

        def on_eval(evaluation) -> None:
            if not main:
                return
            parts = [f"step {evaluation.step}"]
            if evaluation.loss is not None:
                parts.append(f"held-out loss {evaluation.loss.loss:.4f}")
                for metric in evaluation.loss.shown:
                    if metric.headline:
                        value = evaluation.loss.metrics[metric.name]
                        parts.append(f"{metric.label} {metric.format(value)}")
            if evaluation.accuracy is not None:
                parts.append(f"exact match {evaluation.accuracy.accuracy:.1%}")
            progress.console.print("eval: " + ", ".join(parts))

        summary = trainer.train(on_step=on_step, on_eval=on_eval)
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
    saved = trainer.save()
    if main:
        _print_summary(summary, saved)
    return 0


def _headline(record: dict, metrics: list) -> str:
    """The objective's headline metrics of a step (GRPO's reward), as they are shown."""
    values = [(m, record.get(m.name)) for m in metrics]
    return "  ".join(f"{m.label} {m.format(v)}" for m, v in values if v is not None)


def _plain_line(record: dict, total_steps: int) -> str:
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
