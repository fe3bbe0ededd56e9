"""A training run's measured steps as a calibration sample: its saved configuration, the
epoch's micro-batches from its data's lengths, and its steady step time."""

import statistics
from pathlib import Path

from tuneforge.config import load_config
from tuneforge.data.length_policy import RecordLengths
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import link_gbps
from tuneforge.plan.calibration import Sample
from tuneforge.plan.planner import (
    mean_document_length,
    planned_epoch,
    run_model_args,
    sampled_steps,
    setup_of,
)
from tuneforge.plan.prediction import Hardware
from tuneforge.plan.step_estimate import configured_work
from tuneforge.runs.files import CONFIG_FILE, METRICS_FILE, read_metrics
from tuneforge.runs.pace import WARMUP_STEPS


def run_seconds(run_dir: Path) -> float:
    """The run's steady step time: the mean after the first steps, as its pace counts it."""
    file = run_dir / METRICS_FILE
    rows = [r for r in read_metrics(file) if r.get("step_s")] if file.is_file() else []
    if not rows:
        raise TuneforgeError(f"{file}: no step times (a run of tuneforge train writes them)")
    return statistics.fmean(r["step_s"] for r in rows[WARMUP_STEPS:] or rows)


def run_sample(run_dir: Path, hardware: Hardware, records: RecordLengths | None) -> Sample:
    """`records`: the lengths of the run's training records (None: `data.max_seq_len` each)."""
    config_file = run_dir / CONFIG_FILE
    if not config_file.is_file():
        raise TuneforgeError(f"{run_dir}: not a run directory (no {CONFIG_FILE})")
    config = load_config(config_file)
    setup = setup_of(
        config, run_model_args(config), hardware, mean_document_length(config.data, records)
    )
    steps = sampled_steps(config, planned_epoch(config, records))
    works = [[configured_work(config, setup, step)] for step in steps]
    return Sample(str(run_dir), works, run_seconds(run_dir), link_gbps(hardware.gpu)[0])
