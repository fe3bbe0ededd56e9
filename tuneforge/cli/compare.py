"""`tuneforge compare`: an A/B of runs (precisions, or any other change) as a table and a plot."""

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuneforge.cli.common import console, print_table


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
    from tuneforge.api.comparing import compare as compare_runs
    from tuneforge.runs.compare import as_dicts, loss_label

    found = compare_runs(run_dirs, smoothing=smoothing, plot=out)
    summaries, groups, runs, written = found.summaries, found.groups, found.runs, found.plot
    if as_json:
        document: dict[str, Any] = {"reference": summaries[0].name, "loss": found.loss}
        document["runs"] = as_dicts(summaries)
        document["groups"] = [asdict(group) for group in groups]
        console.print_json(json.dumps(document | {"plot": str(written) if written else None}))
        return
    shared = found.same_objective
    loss = "loss (last)" if shared else "cross-entropy (last)"
    table = Table("run", "precision", loss, "gap mean/max", "held-out", "best", "tok/s", "GiB")
    matches = any(summary.final_exact_match is not None for summary in summaries)
    rewarded = any(summary.final_reward is not None for summary in summaries)
    if not shared:
        table.add_column("objective")
    if matches:
        table.add_column("exact match")
    if rewarded:
        table.add_column("reward")
    for summary in summaries:
        reference = summary is summaries[0]
        held_out = _number(summary.final_eval_loss)
        if summary.eval_gap is not None and not reference:
            ends = (summaries[0].final_eval_step, summary.final_eval_step)
            last = ends == (summary.eval_gap_step,) * 2
            where = "" if last else f" at step {summary.eval_gap_step}"
            held_out += f" ({summary.eval_gap:+.1%}{where})"
        row = [
            f"{summary.name} ({summary.steps})",
            summary.precision,
            _with_last(summary),
            "reference" if reference else _gaps(summary),
            held_out,
            _number(summary.best_eval_loss),
            _speed(summary, reference),
            _number(summary.peak_gib, 1),
        ]
        row += [] if shared else [summary.objective]
        row += [_percent(summary.final_exact_match, signed=False)] if matches else []
        row += [_number(summary.final_reward)] if rewarded else []
        table.add_row(*row)
    print_table(table)
    what = "training loss" if shared else "training cross-entropy"
    console.print(
        f"run (steps); {loss}: {loss_label(runs)}: the smoothed {what} at the last step "
        f"(moving average, {smoothing}), the last logged value in brackets; gaps: relative to "
        f"{summaries[0].name}'s smoothed curve; held-out: at the end (relative to the "
        "reference's at the last step both evaluated)"
        + ("; reward: held out at the end, else the last 10 steps' mean" if rewarded else ""),
        markup=False,
    )
    if not shared:
        objectives = ", ".join(f"{run.name}: {run.meaning.label}" for run in runs)
        console.print(
            f"these runs optimise different objectives ({objectives}); their losses are not "
            "alike, so the table compares their cross-entropy on the data where a run logs one "
            "(blank where it does not), and exact match, which every run can have",
            style="yellow", markup=False, highlight=False,
        )  # fmt: skip
    for summary in summaries[1:]:
        if summary.differs_in:
            console.print(
                f"{summary.name} also differs from {summaries[0].name} in "
                f"{len(summary.differs_in)} settings: {', '.join(summary.differs_in)}",
                style="yellow", markup=False, highlight=False,
            )  # fmt: skip
    if any(len(group.runs) > 1 for group in groups):
        _print_groups(groups)
    if written:
        console.print(f"written {written}", markup=False, highlight=False)


def _print_groups(groups) -> None:
    step = groups[0].step
    table = Table("precision", "runs", f"held-out at step {step}: mean", "lowest-highest", "spread")
    table.add_column("gap")
    for group in groups:
        reference = group is groups[0]
        gap = "reference" if reference else _percent(group.gap)
        if not reference and group.within_spread is not None:
            gap += " (within)" if group.within_spread else " (beyond)"
        table.add_row(
            group.precision,
            str(len(group.runs)),
            _number(group.mean_eval),
            f"{_number(group.low_eval)}-{_number(group.high_eval)}",
            _percent(group.spread, signed=False),
            gap,
        )
    print_table(table)
    console.print(
        "runs grouped by precision (and any other setting but the seed); gap: mean held-out "
        f"loss against {groups[0].precision}'s, within or beyond its spread over its runs",
        markup=False,
    )


def _percent(value: float | None, signed: bool = True) -> str:
    if value is None:
        return ""
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _speed(summary, reference: bool) -> str:
    if not summary.tokens_per_s:
        return ""
    ratio = "" if reference or summary.speedup is None else f" ({summary.speedup:.2f}x)"
    return f"{summary.tokens_per_s:,.0f}{ratio}"


def _number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _with_last(summary) -> str:
    if summary.final_loss is None:
        return ""
    return f"{summary.final_loss:.4f} ({summary.last_loss:.4f})"


def _gaps(summary) -> str:
    if summary.mean_gap is None:
        return "no common steps" if summary.final_loss is not None else ""
    return f"{summary.mean_gap:.2%}/{summary.max_gap:.2%}"
