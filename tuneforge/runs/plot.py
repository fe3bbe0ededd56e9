"""`tuneforge plot`: loss, throughput and memory of one or more runs, side by side, each panel
with its unit; the held-out loss as the evaluations it holds (`eval.every_steps` for a curve)."""

from pathlib import Path

from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import read_metrics

PANELS = (
    ("training loss", "nats per supervised token", {"loss": ""}),
    ("held-out loss", "nats per supervised token", {"eval_loss": ""}),
    ("throughput", "tokens/s", {"tokens_per_s": ""}),
    ("GPU memory", "GiB", {"mem_reserved_gib": "reserved", "mem_peak_gib": "peak allocated"}),
)
"""(title, y-axis label, {metric: series name beside the run's}) per panel; a panel shows where
any run has its metrics (memory: GPU runs)."""


def figure_of(runs: dict[str, list[dict]]):
    """The matplotlib figure of `runs` (name -> metrics records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        panel
        for panel in PANELS
        if any(r.get(key) is not None for rs in runs.values() for r in rs for key in panel[2])
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, (title, unit, series) in zip(axes[0], panels, strict=True):
        evaluations = 0
        for name, records in runs.items():
            for key, suffix in series.items():
                points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
                if not points:
                    continue
                steps, values = zip(*points, strict=True)
                label = f"{name} {suffix}".strip()
                held_out = key == "eval_loss"
                marker = "o" if held_out or len(points) < 30 else None
                axis.plot(steps, values, label=label, marker=marker)
                evaluations = max(evaluations, len(points)) if held_out else evaluations
        if 0 < evaluations <= 2:
            title += f"\n({evaluations} evaluations: eval.every_steps for a curve)"
        axis.set_title(title)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(unit)
        if unit in ("GiB", "tokens/s"):  # amounts, read against zero (not a zoomed-in band)
            axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise TuneforgeError('plotting needs matplotlib: pip install "tuneforge[plot]"') from None
    runs = {}
    for run_dir in run_dirs:
        file = run_dir / "metrics.jsonl"
        if not file.is_file():
            raise TuneforgeError(f"{run_dir} has no metrics.jsonl: is it a run directory?")
        runs[run_dir.name] = read_metrics(file)
    figure = figure_of(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
