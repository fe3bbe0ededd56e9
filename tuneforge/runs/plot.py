"""`tuneforge plot`: loss, throughput and memory of one or more runs, side by side, each panel
with its unit; each loss labelled by what it is (runs of different objectives get a panel per
kind of loss); the held-out loss as the evaluations it holds (`eval.every_steps` for a curve)."""

from pathlib import Path
from typing import Any

from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import read_run_metrics
from tuneforge.runs.loss_meaning import loss_meaning

OTHER_PANELS = (
    ("throughput", "tokens/s", {"tokens_per_s": ""}),
    ("GPU memory", "GiB", {"mem_reserved_gib": "reserved", "mem_peak_gib": "peak allocated"}),
)
"""(title, y-axis label, {metric: series name beside the run's}) per panel; a panel shows where
any run has its metrics (memory: GPU runs)."""
IMAGE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def image_file(out: Path) -> Path:
    """The image `--out` names: `.png` added to a name without a suffix; a suffix that is no
    image format refused before any work."""
    if not out.suffix:
        return out.with_name(out.name + ".png")
    if out.suffix.lower().lstrip(".") not in IMAGE_FORMATS:
        raise TuneforgeError(
            f"--out {out}: {out.suffix} is not an image format; use .png, .svg or .pdf "
            f"(or {', '.join('.' + f for f in IMAGE_FORMATS[3:])})"
        )
    return out


def panels_of(configs: dict[str, dict[str, Any]]) -> list[tuple[str, str, dict[str, str], set]]:
    """(title, unit, series, the runs it draws) of each panel: training and held-out loss for
    each kind of loss among the runs, then the others for every run."""
    kinds: dict[str, set[str]] = {}
    for name, config in configs.items():
        kinds.setdefault(loss_meaning(config).label, set()).add(name)
    several = len(kinds) > 1
    panels = []
    for label, names in kinds.items():
        objective = loss_meaning(configs[next(iter(names))]).objective if several else ""
        suffix = f" ({objective})" if several else ""
        panels.append((f"training loss{suffix}", label, {"loss": ""}, names))
        panels.append((f"held-out loss{suffix}", label, {"eval_loss": ""}, names))
    return panels + [(*panel, set(configs)) for panel in OTHER_PANELS]


def figure_of(runs: dict[str, list[dict]], configs: dict[str, dict[str, Any]] | None = None):
    """The matplotlib figure of `runs` (name -> metrics records; `configs`: name -> saved
    configuration, which says what each loss is)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = configs or {name: {} for name in runs}
    panels = [
        panel
        for panel in panels_of(configs)
        if any(r.get(key) is not None for n in panel[3] for r in runs[n] for key in panel[2])
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, (title, unit, series, names) in zip(axes[0], panels, strict=True):
        evaluations = 0
        for name, records in runs.items():
            if name not in names:
                continue
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
        axis.set_ylabel(unit, fontsize="small")
        if unit in ("GiB", "tokens/s"):  # amounts, read against zero (not a zoomed-in band)
            axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """Draw the runs into `out` (`.png` added without a suffix); returns the file written."""
    out = image_file(out)
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise TuneforgeError('plotting needs matplotlib: pip install "tuneforge[plot]"') from None
    runs, configs = {}, {}
    for run_dir in run_dirs:
        runs[run_dir.name], configs[run_dir.name] = read_run_metrics(run_dir)
    figure = figure_of(runs, configs)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
