"""`tuneforge compare`: an A/B of runs (precisions, or any other change) as a table and a plot."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuneforge.cli.common import console


def compare(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories; the first is the reference.")
    ],
    out: Annotated[
        Path | None, typer.Option(help="Also draw the curves into this image (.png, .svg, .pdf).")
    ] = None,
    smoothing: Annotated[
        float, typer.Option(help="Weight of the moving average over training losses (0: none).")
    ] = 0.9,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Loss curves, held-out loss, speed and memory of runs side by side, against the first."""
    from tuneforge.runs.compare import as_dicts, compare_runs, plot_comparison

    summaries = compare_runs(run_dirs, smoothing)
    written = plot_comparison(run_dirs, out, smoothing) if out is not None else None
    if as_json:
        document = {"reference": summaries[0].name, "runs": as_dicts(summaries)}
        console.print_json(json.dumps(document | {"plot": str(written) if written else None}))
        return
    table = Table("run", "precision", "loss", "gap mean/max", "held-out", "best", "tok/s", "GiB")
    for summary in summaries:
        reference = summary is summaries[0]
        held_out = _number(summary.final_eval_loss)
        if summary.eval_gap is not None and not reference:
            ends = (summaries[0].final_eval_step, summary.final_eval_step)
            last = ends == (summary.eval_gap_step,) * 2
            where = "" if last else f" at step {summary.eval_gap_step}"
            held_out += f" ({summary.eval_gap:+.1%}{where})"
        table.add_row(
            f"{summary.name} ({summary.steps})",
            summary.precision,
            _number(summary.final_loss),
            "reference" if reference else _gaps(summary),
            held_out,
            _number(summary.best_eval_loss),
            _speed(summary, reference),
            _number(summary.peak_gib, 1),
        )
    console.print(table)
    console.print(
        f"run (steps); loss: smoothed training loss at the last step (moving average, "
        f"{smoothing}); gaps: relative to {summaries[0].name}'s smoothed curve; held-out: at the "
        "end (relative to the reference's at the last step both evaluated)",
        markup=False,
    )
    for summary in summaries[1:]:
        if summary.differs_in:
            console.print(
                f"[yellow]{summary.name} also differs from {summaries[0].name} in: "
                f"{', '.join(summary.differs_in[:8])}[/yellow]"
            )
    if written:
        console.print(f"written {written}", markup=False, highlight=False)


def _speed(summary, reference: bool) -> str:
    if not summary.tokens_per_s:
        return ""
    ratio = "" if reference or summary.speedup is None else f" ({summary.speedup:.2f}x)"
    return f"{summary.tokens_per_s:,.0f}{ratio}"


def _number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _gaps(summary) -> str:
    if summary.mean_gap is None:
        return "no common steps"
    return f"{summary.mean_gap:.2%}/{summary.max_gap:.2%}"
