"""Distillation end to end on the CPU: the demo's student with a teacher built as the same shape
and seed (identical: the KD loss is 0 at the first step), and with a different teacher (a
distinct seed), whose KD loss the run brings down."""

import subprocess
import sys

import pytest

from tests.cli_runs import DEMO
from tuneforge.runs.files import read_metrics


def _train(tmp_path, name: str, *settings: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "tuneforge", "train", str(DEMO), f"run.output_dir={tmp_path / name}",
        f"data.cache_dir={tmp_path / 'cache'}", "train.objective=distill", "train.max_steps=30",
        "eval.every_steps=30", "eval.num_samples=0", "logging.log_steps=1",
        "logging.progress=false", "distill.teacher.name=demo-tiny", "distill.kd_weight=0.9",
        "distill.temperature=2.0", *settings,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_a_distillation_run_learns_its_teacher(tmp_path):
    same = _train(
        tmp_path,
        "same",
        "train.max_steps=1",
        "eval.every_steps=1",
        "distill.teacher.init_std=0.06",
        "distill.teacher.dtype=float32",
    )
    assert same.returncode == 0, same.stdout + same.stderr
    first = next(r for r in read_metrics(tmp_path / "same" / "metrics.jsonl") if "loss" in r)
    assert first["kd_loss"] == pytest.approx(0.0, abs=1e-5) and first["ce_loss"] > 1.0
    other = _train(tmp_path, "other", "distill.teacher.init_std=0.2")
    assert other.returncode == 0, other.stdout + other.stderr
    records = read_metrics(tmp_path / "other" / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_kd_loss" in r]
    kd = [r["kd_loss"] for r in steps]
    assert sum(kd[-5:]) < 0.85 * sum(kd[:5])
    assert evals[-1]["eval_kd_loss"] < 0.8 * evals[0]["eval_kd_loss"]
    assert "eval_ppl" not in evals[0] and "teacher: demo-tiny" in other.stdout + other.stderr
