"""`tuneforge compare`: runs side by side, the first the reference — their precision, final and
best held-out loss, the gap between their smoothed training curves, speed and peak memory, and
what else differs in their configurations (an A/B of precisions should differ in nothing else).
Runs that optimise different objectives are compared by their cross-entropy on the data where
they log one (`loss_meaning.py`), by exact match, and by reward where they sample replies."""

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuneforge.config.objectives.declaration import CROSS_ENTROPY
from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import METRICS_FILE, read_run_metrics
from tuneforge.runs.loss_meaning import LossMeaning, loss_meaning
from tuneforge.runs.pace import WARMUP_STEPS

REWARD_STEPS = 10

SAME_ANYWHERE = ("run.", "logging.", "checkpoint.", "precision.", "train.time_limit")
"""Settings an A/B may change without making the comparison unfair (a run stopped sooner by
its time limit shows in its steps)."""


@dataclass
class RunCurves:
    name: str
    precision: str
    steps: list[int]
    losses: list[float]
    smoothed: list[float]
    evals: list[tuple[int, float]]
    tokens_per_s: float | None
    peak_gib: float | None
    meaning: LossMeaning
    exact_match: list[tuple[int, float]]
    config: dict[str, Any] = field(repr=False)
    records: list[dict[str, Any]] = field(repr=False)

    @property
    def final_eval(self) -> float | None:
        return self.evals[-1][1] if self.evals else None

    @property
    def best_eval(self) -> float | None:
        return min(value for _, value in self.evals) if self.evals else None


@dataclass
class RunSummary:
    name: str
    precision: str
    objective: str
    compared_by: str
    """What `final_loss`, the gaps and the held-out values are: the runs' loss, or their
    cross-entropy where they optimise different objectives."""
    steps: int
    final_loss: float | None
    """The smoothed training loss at the last step."""
    last_loss: float | None
    """The last logged value, which the smoothed one lags."""
    final_eval_loss: float | None
    final_eval_step: int | None
    best_eval_loss: float | None
    mean_gap: float | None
    """Mean of |smoothed loss - the reference's| over their common steps, relative to the
    reference's smoothed loss (0.01 = 1%)."""
    max_gap: float | None
    final_gap: float | None
    eval_gap: float | None
    """The held-out loss against the reference's, relative, at the last step both evaluated."""
    eval_gap_step: int | None
    """That step: the runs' last evaluation unless one of them stopped sooner."""
    tokens_per_s: float | None
    speedup: float | None
    """Tokens/s over the reference's."""
    peak_gib: float | None
    final_exact_match: float | None
    final_reward: float | None
    """A run that scores sampled replies (GRPO): its held-out reward at the last evaluation,
    else its mean training reward over the last `REWARD_STEPS` logged steps."""
    differs_in: list[str]
    """Settings other than precision, run, logging and checkpoint that differ from the reference."""


def smooth(values: list[float], weight: float) -> list[float]:
    """An exponential moving average, debiased (TensorBoard's smoothing)."""
    out, average = [], 0.0
    for index, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**index) if weight > 0 else value)
    return out


def read_run(run_dir: Path, smoothing: float) -> RunCurves:
    records, config = read_run_metrics(run_dir)
    if not any(r.get("loss") is not None for r in records):
        raise TuneforgeError(f"{run_dir / METRICS_FILE} holds no training step yet")
    training = [r for r in records if r.get("loss") is not None]
    speeds = [r["tokens_per_s"] for r in training[WARMUP_STEPS:] if r.get("tokens_per_s")]
    peaks = [r["mem_peak_gib"] for r in records if r.get("mem_peak_gib") is not None]
    run = RunCurves(
        name=run_dir.name,
        precision=precision_label(config),
        steps=[],
        losses=[],
        smoothed=[],
        evals=[],
        tokens_per_s=statistics.median(speeds) if speeds else None,
        peak_gib=max(peaks) if peaks else None,
        meaning=loss_meaning(config),
        exact_match=[
            (int(r["step"]), float(r["eval_accuracy"])) for r in records if "eval_accuracy" in r
        ],
        config=config,
        records=records,
    )
    return follow(run, "loss", "eval_loss", smoothing)


def follow(run: RunCurves, key: str | None, eval_key: str | None, smoothing: float) -> RunCurves:
    """`run` with its training curve read from metric `key` and its held-out one from
    `eval_key` (empty where the run does not log them)."""
    training = [r for r in run.records if key and r.get(key) is not None]
    run.steps = [int(r["step"]) for r in training]
    run.losses = [float(r[key]) for r in training] if key else []
    run.smoothed = smooth(run.losses, smoothing)
    run.evals = [
        (int(r["step"]), float(r[eval_key])) for r in run.records if eval_key and eval_key in r
    ]
    return run


def precision_label(config: dict[str, Any]) -> str:
    precision = config.get("precision") or {}
    if precision.get("fp8"):
        only = ", base in FP8 only" if precision.get("fp8_base_weights") else ""
        return f"fp8 {precision['fp8']} {precision.get('fp8_scaling', 'rowwise')}{only}"
    if precision.get("fp4"):
        packed = ", packed" if precision.get("fp4_param") else ""
        return f"fp4 {precision.get('fp4_recipe', 'nvfp4')} (emulated{packed})"
    return (config.get("model") or {}).get("dtype", "unknown")


def read_runs(run_dirs: list[Path], smoothing: float = 0.9) -> list[RunCurves]:
    """The runs' curves: their loss when they optimise the same objective, else their
    cross-entropy on the data (none for a run that does not log it)."""
    if not 0 <= smoothing < 1:
        raise TuneforgeError(f"--smoothing must be in [0, 1), not {smoothing}")
    seen: dict[Path, Path] = {}
    for run_dir in run_dirs:
        first = seen.setdefault(run_dir.resolve(), run_dir)
        if first is not run_dir:  # counted twice, one run would make a spread of its own
            raise TuneforgeError(f"{run_dir} is given twice (as {first}): name each run once")
    runs = [read_run(run_dir, smoothing) for run_dir in run_dirs]
    if not same_objective(runs):
        for run in runs:
            follow(run, run.meaning.cross_entropy, run.meaning.eval_cross_entropy, smoothing)
    return runs


def same_objective(runs: list[RunCurves]) -> bool:
    return len({run.meaning.label for run in runs}) == 1


def loss_label(runs: list[RunCurves]) -> str:
    """What the compared curves measure."""
    return runs[0].meaning.label if same_objective(runs) else CROSS_ENTROPY


def summarize(runs: list[RunCurves]) -> list[RunSummary]:
    """Each run against the first."""
    compared_by = "loss" if same_objective(runs) else "cross-entropy"
    return [_summary(run, runs[0], compared_by) for run in runs]


def compare_runs(run_dirs: list[Path], smoothing: float = 0.9) -> list[RunSummary]:
    return summarize(read_runs(run_dirs, smoothing))


def _summary(run: RunCurves, reference: RunCurves, compared_by: str) -> RunSummary:
    theirs = dict(zip(reference.steps, reference.smoothed, strict=True))
    gaps = [
        abs(value - theirs[step]) / abs(theirs[step])
        for step, value in zip(run.steps, run.smoothed, strict=True)
        if theirs.get(step)
    ]
    final_gap = gaps[-1] if gaps else None
    evaluated = dict(reference.evals)
    shared = [(step, value) for step, value in run.evals if evaluated.get(step)]
    eval_gap = eval_gap_step = None
    if shared:
        eval_gap_step, value = shared[-1]
        eval_gap = (value - evaluated[eval_gap_step]) / evaluated[eval_gap_step]
    steps = [int(r["step"]) for r in run.records if r.get("loss") is not None]
    return RunSummary(
        name=run.name,
        precision=run.precision,
        objective=run.meaning.objective,
        compared_by=compared_by,
        steps=steps[-1],
        final_loss=run.smoothed[-1] if run.smoothed else None,
        last_loss=run.losses[-1] if run.losses else None,
        final_eval_loss=run.final_eval,
        final_eval_step=run.evals[-1][0] if run.evals else None,
        best_eval_loss=run.best_eval,
        mean_gap=sum(gaps) / len(gaps) if gaps else None,
        max_gap=max(gaps) if gaps else None,
        final_gap=final_gap,
        eval_gap=eval_gap,
        eval_gap_step=eval_gap_step,
        tokens_per_s=run.tokens_per_s,
        speedup=(
            run.tokens_per_s / reference.tokens_per_s
            if run.tokens_per_s and reference.tokens_per_s
            else None
        ),
        peak_gib=run.peak_gib,
        final_exact_match=run.exact_match[-1][1] if run.exact_match else None,
        final_reward=final_reward(run.records),
        differs_in=_differences(run.config, reference.config),
    )


def final_reward(records: list[dict[str, Any]]) -> float | None:
    held_out = [r["eval_reward"] for r in records if r.get("eval_reward") is not None]
    if held_out:
        return float(held_out[-1])
    steps = [r for r in records if r.get("loss") is not None and r.get("reward") is not None]
    rewards = [r["reward"] for r in steps][-REWARD_STEPS:]
    return statistics.fmean(rewards) if rewards else None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat |= flatten(value, f"{prefix}{key}.")
    return flat


def _differences(config: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    ours, theirs = flatten(config), flatten(reference)
    keys = sorted(set(ours) | set(theirs))
    return [
        key
        for key in keys
        if not key.startswith(SAME_ANYWHERE) and ours.get(key) != theirs.get(key)
    ]


def as_dicts(summaries: list[RunSummary]) -> list[dict[str, Any]]:
    return [asdict(summary) for summary in summaries]


def plot_comparison(run_dirs: list[Path], out: Path, smoothing: float = 0.9) -> Path:
    """Training loss (raw, faint, and smoothed) and held-out loss of each run, and each run's
    smoothed gap to the first."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TuneforgeError('plotting needs matplotlib: pip install "tuneforge[plot]"') from None
    runs = read_runs(run_dirs, smoothing)
    reference = dict(zip(runs[0].steps, runs[0].smoothed, strict=True))
    figure, (train, held_out, gap) = plt.subplots(1, 3, figsize=(16, 4.5))
    for run in runs:
        label = f"{run.name} ({run.precision}, {run.meaning.objective})"
        (line,) = train.plot(run.steps, run.smoothed, label=label)
        train.plot(run.steps, run.losses, color=line.get_color(), alpha=0.2, linewidth=0.8)
        if run.evals:
            steps, values = zip(*run.evals, strict=True)
            held_out.plot(steps, values, marker="o", color=line.get_color(), label=label)
        common = [(s, v) for s, v in zip(run.steps, run.smoothed, strict=True) if s in reference]
        gap.plot(
            [s for s, _ in common],
            [100 * (v - reference[s]) / reference[s] for s, v in common],
            color=line.get_color(),
        )
    what = "training loss" if same_objective(runs) else "training cross-entropy"
    unit = loss_label(runs)
    train.set(title=f"{what} (smoothed {smoothing})", xlabel="step", ylabel=unit)
    held_out.set(title=f"held-out {what.split()[-1]}", xlabel="step", ylabel=unit)
    gap.set(
        title=f"gap to {runs[0].name}",
        xlabel="step",
        ylabel=f"smoothed {what.split()[-1]} difference (%)",
    )
    for axis in (train, held_out, gap):
        axis.grid(alpha=0.3)
    train.legend(fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
