"""`tuneforge slurm status RUN_DIR`: steps done, jobs used, throughput and ETA of a chain."""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tuneforge.runs.files import JOBS_FILE, read_metrics


@dataclass
class ChainStatus:
    state: str
    """`not started` (no job has set the run up), `no step logged yet`, `in progress`, `finished`."""
    steps_done: int
    total_steps: int | None
    finished: bool
    jobs: list[dict]
    tokens_per_s: float | None
    eta_s: float | None


def chain_status(run_dir: Path) -> ChainStatus:
    records = []
    if (run_dir / "metrics.jsonl").is_file():
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    jobs = []
    if (run_dir / JOBS_FILE).is_file():
        jobs = [json.loads(line) for line in (run_dir / JOBS_FILE).read_text().splitlines() if line]
    total = None
    if (run_dir / "config.yaml").is_file():
        from tuneforge.config import load_config

        total = load_config(run_dir / "config.yaml").train.max_steps
    recent = records[-20:]
    finished = (run_dir / "finished").is_file()
    if finished:
        state = "finished"
    elif records:
        state = "in progress"
    elif (run_dir / "config.yaml").is_file():
        state = "no step logged yet"
    else:
        state = "not started"
    return ChainStatus(
        state=state,
        steps_done=records[-1]["step"] if records else 0,
        total_steps=total,
        finished=finished,
        jobs=jobs,
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in recent) if recent else None,
        eta_s=records[-1].get("eta_s") if records else None,
    )
