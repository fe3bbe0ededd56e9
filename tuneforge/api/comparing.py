"""`tuneforge.compare(...)`: runs side by side against the first: the gap between their
smoothed loss curves, held-out figures, speed and memory, and the precision groups."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneforge.runs.compare import RunCurves, RunSummary
    from tuneforge.runs.compare_groups import PrecisionGroup


@dataclass
class Comparison:
    summaries: "list[RunSummary]"
    """One per run, in the order given; the first is the reference."""
    groups: "list[PrecisionGroup]"
    """Runs grouped by precision (and any setting but the seed), judged against the first's
    spread."""
    loss: str
    """What the loss compared is (the shared objective's loss, or the cross-entropy)."""
    same_objective: bool
    runs: "list[RunCurves]"
    plot: Path | None = None


def compare(
    runs: Sequence[str | Path], *, smoothing: float = 0.9, plot: str | Path | None = None
) -> Comparison:
    """Compare run directories against the first; `plot` also draws the curves into that image
    (.png, .svg, .pdf). Raises `TuneforgeError` for a directory without metrics, or one named
    twice."""
    from tuneforge.runs.compare import (
        loss_label,
        plot_comparison,
        read_runs,
        same_objective,
        summarize,
    )
    from tuneforge.runs.compare_groups import group_by_precision
    from tuneforge.runs.plot import image_file

    run_dirs = [Path(run) for run in runs]
    image = image_file(Path(plot)) if plot is not None else None
    curves = read_runs(run_dirs, smoothing)
    written = plot_comparison(run_dirs, image, smoothing) if image is not None else None
    return Comparison(
        summarize(curves), group_by_precision(curves), loss_label(curves),
        same_objective(curves), curves, written,
    )  # fmt: skip
