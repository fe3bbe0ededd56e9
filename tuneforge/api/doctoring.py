"""`tuneforge.doctor_oom(...)` and `tuneforge.doctor_log(...)`: what an out-of-memory error
means and what to do, and what a training log or a run's metrics show going wrong."""

from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge.api.configuration import ConfigLike
from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:
    from tuneforge.doctor.log_scan import LogReport
    from tuneforge.doctor.oom import OomReport


def doctor_oom(
    text: str,
    *,
    torch_version: str | None = None,
    config: ConfigLike | None = None,
    gpus: int = 1,
) -> "OomReport":
    """The kind of out-of-memory error in `text` (fragmentation, memory pressure, other
    processes, the runtime's or the host's memory), its figures and the actions to take; with
    the run's `config`, each remedy sized by the planner. `torch_version`: the failed run's
    (default: this one's)."""
    from importlib.metadata import PackageNotFoundError, version

    from tuneforge.api.configuration import config as load
    from tuneforge.doctor.oom import diagnose

    loaded = load(config) if config is not None else None  # its mistakes, whatever the error

    if torch_version is None:  # the version only, not torch itself: reading a message is quick
        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            torch_version = None
    report = diagnose(text, torch_version)
    if loaded is not None and report.kind in ("pressure", "runtime"):
        from tuneforge.doctor.oom_plan import remedies

        report.actions += remedies(loaded, gpus, report.total_gib, _lengths(loaded))
    return report


def doctor_log(
    run: str | Path,
    *,
    time_limit: str | None = None,
    config: ConfigLike | None = None,
    gpus: int = 1,
    gpu: str = "H100",
) -> "LogReport":
    """Allocator warnings, NaNs, restarts from step 0, ETA against `time_limit`, collective
    errors, in a training log, a run's metrics.jsonl or its directory; with the run's `config`,
    its step time against the planner's."""
    from tuneforge.runs.files import METRICS_FILE

    path = Path(run)
    if path.is_dir() and (path / METRICS_FILE).is_file():
        path = path / METRICS_FILE
    if not path.is_file():
        raise TuneforgeError(f"{path}: no such file")
    with path.open(encoding="utf-8", errors="replace") as lines:  # streamed, line by line
        return scan_lines(lines, time_limit, config, gpus, gpu)


def scan_lines(lines, time_limit: str | None, config: ConfigLike | None, gpus: int, gpu: str):
    """`doctor_log` of lines read elsewhere (a pipe)."""
    from tuneforge.config.durations import parse_duration
    from tuneforge.doctor.log_scan import scan_log

    try:
        limit = parse_duration(time_limit) if time_limit is not None else None
    except ValueError as error:
        raise TuneforgeError(f"--time-limit: {error}") from None
    report = scan_log(lines, limit)
    if config is not None:
        from tuneforge.api.configuration import config as load
        from tuneforge.doctor.log_expectation import compare_with_plan
        from tuneforge.plan.planner import plan_run
        from tuneforge.plan.prediction import Hardware

        loaded = load(config)
        compare_with_plan(report, plan_run(loaded, Hardware(gpus=gpus, gpu=gpu), _lengths(loaded)))
    return report


def _lengths(loaded):
    from tuneforge.api.planning import record_lengths

    return record_lengths(loaded)
