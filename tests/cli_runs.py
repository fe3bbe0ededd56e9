"""Running the command line as a user would, in a child process, and reading what a run left:
shared by the end-to-end tests."""

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import QUIET_DEMO
from tuneforge.runs.files import read_metrics

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo.yaml"
STEPS = 12
LORA = ["lora.enabled=true", "lora.rank=4", "lora.dropout=0.1", "train.lr=1e-2"]
MODES = {
    "full": [],
    # bf16 weights over fp32 masters: the checkpoint holds the masters, the resume splits them back
    "full-bf16-master": ["model.dtype=bfloat16", "precision.master_weights=true"],
    "lora": LORA,
    # emulated FP4 rounds output gradients stochastically: the resume must restore that too
    "lora-fp4": [*LORA, "precision.fp4=e2m1", "precision.fp4_param=true"],
    # QLoRA: the 4-bit base is made again from the model's weights on resume
    "qlora": [*LORA, "model.quantize=nf4"],
}


def overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        f"run.output_dir={run_dir}",
        f"data.cache_dir={run_dir.parent / 'cache'}",
        f"train.max_steps={STEPS}",
        "train.warmup_steps=2",
        "train.tokens_per_micro_batch=512",
        "train.grad_accum_steps=2",
        *QUIET_DEMO,
        "checkpoint.save_steps=3",
        "checkpoint.keep_last=2",
        *extra,
    ]


WIDE_LOG = os.environ | {"COLUMNS": "1000"}
"""A child's environment whose log lines are not wrapped: rich folds a line at the console's
width, inside a word where the word is a long path, so a message searched for in the log would
be found or not by the length of the test's temporary directory."""


def cli(run_dir: Path, *extra: str, resume: bool = False) -> subprocess.Popen:
    args = [sys.executable, "-m", "tuneforge", "train", str(DEMO), *overrides(run_dir, *extra)]
    args += ["--resume", "auto"] if resume else ["--overwrite"]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=WIDE_LOG
    )


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


def finish(process: subprocess.Popen, expected: int = 0) -> None:
    out, err = process.communicate(timeout=600)
    assert process.returncode == expected, out + err


def wait_for_step(run_dir: Path, step: int, process: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if (run_dir / "metrics.jsonl").is_file() and len(losses(run_dir)) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {step}")


def torchrun(ranks: int) -> list[str]:
    """The command that starts `ranks` processes on this machine, each computing with one thread
    (torchrun's own default), whatever thread count the suite runs with."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    return ["env", "OMP_NUM_THREADS=1", sys.executable, *launcher]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuneforge", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_clean_failure(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for text in expected:
        assert text in result.stderr, result.stderr
