"""Experiment trackers beside `metrics.jsonl` (`logging.report_to`): Weights & Biases and MLflow
through their own libraries, each given the run's configuration once and every metrics line's
numbers at its step. A resumed run continues the same tracked run (its id is kept in the run
directory). W&B honours `WANDB_MODE` (offline writes to the run directory); MLflow writes to
`MLFLOW_TRACKING_URI`, or to `<run dir>/mlruns` without one."""

import contextlib
import netrc
import os
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tuneforge.config import RunConfig
from tuneforge.config.packages import missing_packages
from tuneforge.errors import TuneforgeError

WANDB_ID, MLFLOW_ID = "wandb_run_id", "mlflow_run_id"
"""Files in the run directory naming the tracked run, for a resumed job."""


class Tracker(Protocol):
    def log(self, numbers: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _require(package: str, name: str):
    try:
        return __import__(package)
    except ImportError:
        raise TuneforgeError(
            f"logging.report_to: {name} needs the {package} package: "
            f"pip install 'tuneforge[{name}]', or leave {name} out of report_to"
        ) from None


def _stored_id(run_dir: Path, file: str) -> str | None:
    path = run_dir / file
    return path.read_text().strip() if path.is_file() else None


class WandbTracker:
    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        wandb = _require("wandb", "wandb")
        run_id = _stored_id(run_dir, WANDB_ID)
        self.run = wandb.init(
            project=config.logging.project, name=config.run.name, dir=str(run_dir),
            config=config.model_dump(mode="json"), id=run_id, resume="allow" if run_id else None,
        )  # fmt: skip
        (run_dir / WANDB_ID).write_text(self.run.id)

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.mlflow = _require("mlflow", "mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:  # MLflow's own files in the run directory (it asks to be told so)
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow.set_tracking_uri(uri)
        self.mlflow.set_experiment(config.logging.project)
        run_id = _stored_id(run_dir, MLFLOW_ID)
        run = self.mlflow.start_run(run_id=run_id, run_name=None if run_id else config.run.name)
        if run_id is None:
            self.mlflow.log_params(flat(config.model_dump(mode="json")))
        (run_dir / MLFLOW_ID).write_text(run.info.run_id)

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(numbers, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def flat(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """`section.field` -> its value as text (MLflow's parameters are flat strings of at most 6,000
    characters)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flat(value, f"{name}.")
        else:
            out[name] = str(value)[:6000]
    return out


TRACKERS: dict[str, Callable[[RunConfig, Path], Tracker]] = {
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def open_trackers(config: RunConfig, run_dir: Path) -> list[Tracker]:
    return [
        TRACKERS[name](config, run_dir) for name in config.logging.report_to if name in TRACKERS
    ]


OFFLINE_WANDB = ("offline", "disabled", "dryrun")
PROBE_TIMEOUT_S = 3.0


def wandb_problem(environ: dict[str, str]) -> str | None:
    """Why W&B could not log from here: online mode without an API key."""
    if environ.get("WANDB_MODE", "").lower() in OFFLINE_WANDB or environ.get("WANDB_API_KEY"):
        return None
    host = urllib.parse.urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with contextlib.suppress(OSError, netrc.NetrcParseError):  # no ~/.netrc, or a broken one
        if netrc.netrc().authenticators(host or "api.wandb.ai"):
            return None
    return (
        "logging.report_to: wandb has no API key here (WANDB_API_KEY, or `wandb login`): set "
        "one, or WANDB_MODE=offline to write W&B's files into the run directory"
    )


def mlflow_problem(environ: dict[str, str]) -> str | None:
    """Why MLflow could not log from here: a tracking server that does not answer."""
    uri = environ.get("MLFLOW_TRACKING_URI", "")
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("http", "https") or parsed.hostname is None:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        return (
            f"logging.report_to: mlflow: MLFLOW_TRACKING_URI={uri} does not answer ({error}): "
            "start the server or fix the URI, or unset it to log into <run dir>/mlruns"
        )
    return None


def tracker_problems(config: RunConfig, environ: dict[str, str] | None = None) -> list[str]:
    """Why each tracker the configuration asks for could not log from here."""
    environ = dict(os.environ) if environ is None else environ
    checks = {"wandb": wandb_problem, "mlflow": mlflow_problem}
    problems = [checks[name](environ) for name in config.logging.report_to if name in checks]
    return [problem for problem in problems if problem]


def check_trackers(config: RunConfig, environ: dict[str, str] | None = None) -> None:
    """Refuse a tracker that could not log from here."""
    problems = tracker_problems(config, environ)
    if problems:
        raise TuneforgeError("; ".join(problems))


def require_packages(config: RunConfig) -> None:
    """Refuse a run whose optional packages (a tracker's, bitsandbytes, torchao, ...) are
    missing."""
    missing = missing_packages(config)
    if missing:
        raise TuneforgeError("; ".join(package.message() for package in missing))
