"""`tuneforge plot`: loss, throughput and memory of one or more runs, side by side."""

from pathlib import Path

from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import read_metrics

PANELS = (
    ("loss", "training loss"),
    ("eval_loss", "held-out loss"),
    ("tokens_per_s", "tokens/s"),
    ("mem_reserved_gib", "memory reserved (GiB)"),
)


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TuneforgeError('plotting needs matplotlib: pip install "tuneforge[plot]"') from None
    runs = {}
    for run_dir in run_dirs:
        file = run_dir / "metrics.jsonl"
        if not file.is_file():
            raise TuneforgeError(f"{run_dir} has no metrics.jsonl: is it a run directory?")
        runs[run_dir.name] = read_metrics(file)
    panels = [
        (key, title)
        for key, title in PANELS
        if any(record.get(key) is not None for records in runs.values() for record in records)
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, (key, title) in zip(axes[0], panels, strict=True):
        for name, records in runs.items():
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, label=name, marker="." if len(points) < 30 else None)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
