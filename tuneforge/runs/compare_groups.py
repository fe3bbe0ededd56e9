"""Runs of one precision taken together. Two runs of one configuration part ways as soon as a
kernel accumulates in another order (on a GPU some do from run to run), so a precision's gap
means something only where it is larger than the reference precision's own spread over several
runs (seeds, or repeats of one seed)."""

import statistics
from dataclasses import dataclass

from tuneforge.runs.compare import SAME_ANYWHERE, RunCurves, flatten

SEED = "train.seed"


@dataclass
class PrecisionGroup:
    precision: str
    """The runs' precision, and any other setting (but the seed) that sets them apart from the
    first run."""
    runs: list[str]
    step: int | None
    """The last held-out step every compared run evaluated: where the groups are compared."""
    mean_eval: float | None
    low_eval: float | None
    high_eval: float | None
    spread: float | None
    """(highest - lowest) / mean held-out loss at `step`; None for a single run."""
    mean_final_loss: float | None
    """Mean smoothed training loss at each run's last step (None: no run has the curve)."""
    gap: float | None
    """Mean held-out loss against the reference group's, relative."""
    within_spread: bool | None
    """Whether |gap| is within the reference group's spread (None: that spread is unknown)."""


def common_eval_step(runs: list[RunCurves]) -> int | None:
    shared = set.intersection(*({step for step, _ in run.evals} for run in runs))
    return max(shared) if shared else None


def group_by_precision(runs: list[RunCurves]) -> list[PrecisionGroup]:
    """One group per precision (and per other setting but the seed that differs), in the order
    they first appear; the first is the reference."""
    step = common_eval_step(runs)
    members: dict[str, list[RunCurves]] = {}
    for run in runs:
        members.setdefault(_label(run, runs[0]), []).append(run)
    groups = [_group(label, group, step) for label, group in members.items()]
    reference = groups[0]
    for group in groups:
        if group.mean_eval is not None and reference.mean_eval:
            group.gap = (group.mean_eval - reference.mean_eval) / reference.mean_eval
            if reference.spread is not None:
                group.within_spread = abs(group.gap) <= reference.spread
    return groups


def _settings(run: RunCurves) -> dict:
    return {
        key: value
        for key, value in flatten(run.config).items()
        if not key.startswith(SAME_ANYWHERE) and key != SEED
    }


def _label(run: RunCurves, first: RunCurves) -> str:
    ours, theirs = _settings(run), _settings(first)
    differing = [f"{key}={ours.get(key)}" for key in sorted(ours) if ours[key] != theirs.get(key)]
    return ", ".join([run.precision, *differing])


def _group(precision: str, runs: list[RunCurves], step: int | None) -> PrecisionGroup:
    values = [dict(run.evals)[step] for run in runs] if step is not None else []
    mean = statistics.fmean(values) if values else None
    spread = None
    if mean and len(values) > 1:
        spread = (max(values) - min(values)) / mean
    return PrecisionGroup(
        precision=precision,
        runs=[run.name for run in runs],
        step=step,
        mean_eval=mean,
        low_eval=min(values) if values else None,
        high_eval=max(values) if values else None,
        spread=spread,
        mean_final_loss=(
            statistics.fmean(run.smoothed[-1] for run in runs if run.smoothed)
            if any(run.smoothed for run in runs)
            else None
        ),
        gap=None,
        within_spread=None,
    )
