"""The `tuneforge` command line: parses arguments, calls the library, prints for humans."""

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tuneforge.cli_bench import bench_command
from tuneforge.cli_data import data_app
from tuneforge.cli_doctor import doctor_app
from tuneforge.cli_export import export_app
from tuneforge.cli_plan import plan_command
from tuneforge.cli_slurm import slurm_command
from tuneforge.config import ConfigError, dump_config, load_config
from tuneforge.errors import TuneforgeError

EXIT_USAGE = 2
EXIT_NONFINITE = 3

app = typer.Typer(
    help="Fine-tune large language models, and know before launch whether the run fits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Inspect and check configurations.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(export_app, name="export")
app.add_typer(doctor_app, name="doctor")
app.command("plan")(plan_command)
app.command("slurm")(slurm_command)
app.command("bench")(bench_command)

console = Console()
error_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="Run configuration (YAML).")]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. train.lr=2e-4 lora.rank=32.")
]


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if os.environ.get("RANK", "0") != "0":  # under torchrun the first rank speaks for all
        level = logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(message)s",
        handlers=[RichHandler(console=error_console, show_path=False, show_time=False)],
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@config_app.command("show")
def config_show(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Print the resolved configuration (presets merged, overrides and defaults applied)."""
    console.print(
        dump_config(load_config(config, overrides or [])), end="", markup=False, highlight=False
    )


@config_app.command("validate")
def config_validate(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Check a configuration; every problem is listed at once (exit code 2 if any)."""
    load_config(config, overrides or [])
    console.print(f"[green]ok[/green]: {config} is valid")


@config_app.command("fields")
def config_fields(
    markdown: Annotated[
        bool, typer.Option(help="Print the Markdown reference (docs/config.md).")
    ] = False,
) -> None:
    """List every configuration field with its type, default and help."""
    from tuneforge.config.help import field_rows, fields_markdown

    if markdown:
        console.print(fields_markdown(), end="", markup=False, highlight=False, soft_wrap=True)
        return
    table = Table("field", "type", "default", "help")
    for row in field_rows():
        table.add_row(*row)
    console.print(table)


@app.command()
def models() -> None:
    """List the catalog shapes (usable as model.name, e.g. for random-init proxies)."""
    from tuneforge.models.catalog import CATALOG

    table = Table(
        "name", "family", "layers", "dim", "heads (kv)", "ffn", "experts", "params", "active"
    )
    for name, args in CATALOG.items():
        experts = f"{args.moe.top_k} of {args.moe.num_experts}" if args.moe else "-"
        table.add_row(
            name,
            args.family,
            str(args.num_layers),
            str(args.dim),
            f"{args.num_heads} ({args.num_kv_heads})",
            str(args.moe.expert_ffn_dim if args.moe else args.ffn_dim),
            experts,
            f"{args.num_params() / 1e9:.2f} B",
            f"{args.num_params(active=True) / 1e9:.2f} B",
        )
    console.print(table)


@app.command()
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
    from tuneforge.train.loop import Trainer
    from tuneforge.train.run_dir import is_finished

    _setup_logging(verbose)
    # SLURM's USR1 means "save and stop": the loop handles it; outside the loop (setup, the final
    # save) it must not kill the process
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    run_config = load_config(config, overrides or [])
    if resume != "never" and is_finished(run_config.run.directory):
        console.print(f"{run_config.run.directory} already finished: nothing to do")
        return
    trainer = Trainer(run_config, overwrite=overwrite, resume=resume, force=force)
    try:
        code = _train(trainer, run_config)
    finally:
        trainer.close()
    if code:
        raise typer.Exit(code)


def _train(trainer, run_config) -> int:
    from tuneforge.train.time_budget import EXIT_RESUME

    trainer.setup()
    main = trainer.world.is_main
    if main:
        start = f"from step {trainer.resumed_from} " if trainer.resumed_from else ""
        console.print(
            f"run directory: {trainer.run_dir}  ({trainer.total_steps} steps {start}on "
            f"{trainer.world.world_size} x {trainer.device.type}, {trainer.strategy})"
        )
    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  {task.fields[tps]:,.0f} tok/s"
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
        )

        def on_step(record: dict) -> None:
            progress.update(
                task, advance=1, loss=record["loss"], lr=record["lr"], tps=record["tokens_per_s"]
            )
            step = record["step"]
            if plain_lines and (step % log_steps == 0 or step == trainer.total_steps):
                console.print(
                    _plain_line(record, trainer.total_steps), markup=False, highlight=False
                )

        def on_eval(evaluation) -> None:
            if not main:
                return
            parts = [f"step {evaluation.step}"]
            if evaluation.loss is not None:
                parts.append(f"held-out loss {evaluation.loss.loss:.4f}")
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


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    out: Annotated[Path, typer.Option(help="Image file to write (.png, .svg, .pdf).")],
) -> None:
    """Loss, throughput and memory curves of runs side by side."""
    from tuneforge.train.plot import plot_runs

    console.print(f"written {plot_runs(run_dirs, out)}", markup=False, highlight=False)


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


@app.command()
def generate(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of a finished training run.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="User message to answer.")],
    max_new_tokens: Annotated[int, typer.Option(help="Longest reply.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
) -> None:
    """Answer a prompt with a trained run (base + adapter, or full weights)."""
    import torch

    from tuneforge.models.generate import generate as generate_tokens
    from tuneforge.train.artifacts import load_trained
    from tuneforge.train.build import pick_device

    model, tokenizer = load_trained(run_dir, pick_device())
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stop = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    reply = generate_tokens(model, [ids], max_new_tokens, stop, temperature, generator)[0]
    console.print(tokenizer.decode(reply, skip_special_tokens=True), markup=False, highlight=False)


def main() -> None:
    try:
        app()
    except ConfigError as error:
        error_console.print(str(error), markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)
    except TuneforgeError as error:
        error_console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)
