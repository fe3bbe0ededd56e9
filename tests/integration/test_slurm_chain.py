"""A real SLURM chain (`.ci/slurm-up.sh` starts slurmctld and slurmd on this machine): three
one-minute jobs train a tiny CPU model for more steps than one job can do. The run must end at
exactly the configured step, every job must resume from the previous job's last checkpoint, and
no job may run once training has finished."""

import itertools
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_runs import torchrun
from tuneforge.runs.files import read_metrics

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"
JOB_SECONDS = 60
JOB_TRAINING_LIMIT = "25s"
"""train.time_limit of each job: the trainer stops itself, whatever SLURM's signal timing."""
TRAINING_SECONDS_PER_JOB = 20
"""What is left of that after the stop margin."""


def slurm_ready() -> str | None:
    if shutil.which("sbatch") is None:
        return "SLURM is not installed (run .ci/slurm-up.sh as root)"
    result = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if result.returncode != 0 or "idle" not in result.stdout:
        return f"no idle SLURM node (sinfo: {result.stdout.strip() or result.stderr.strip()})"
    return None


def overrides(run_dir: Path, steps: int) -> list[str]:
    return [
        f"run.output_dir={run_dir}",
        f"run.name=chain-{run_dir.parent.name[-12:]}",
        f"data.cache_dir={run_dir.parent / 'cache'}",
        f"train.max_steps={steps}",
        "train.warmup_steps=5",
        "train.tokens_per_micro_batch=1024",
        "data.eval=[]",
        "eval.every_steps=null",
        "eval.num_samples=0",
        "checkpoint.save_steps=25",
        "checkpoint.exit_margin_s=3",
        f"train.time_limit={JOB_TRAINING_LIMIT}",
        "logging.log_steps=1",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]


def slurm_nodes() -> int:
    if slurm_ready() is not None:
        return 0
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True)
    return result.stdout.split().count("idle")


def job_state(job: str) -> str:
    result = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    for field in result.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "GONE"


def run_chain(tmp_path: Path, extra: list[str], ranks: int, chain: list[str]):
    """A three-job chain of one-minute jobs for more steps than one job does: (run directory,
    steps, jobs.jsonl's entries, job ids). `ranks` processes train (one: no torchrun); a probe
    run of the same layout measures this machine's step time first."""
    probe = tmp_path / "probe"
    started = time.perf_counter()
    launcher = torchrun(ranks) if ranks > 1 else [sys.executable]
    train = ["-m", "tuneforge", "train", str(DEMO), *overrides(probe, 40), *extra]
    # warm the tokenised-data cache and measure the step time (a busy machine may reach the
    # time limit first: exit code 75, its steps measured all the same)
    probed = subprocess.run([*launcher, *train], capture_output=True, text=True)
    assert probed.returncode in (0, 75), probed.stderr[-4000:]
    records = [r for r in read_metrics(probe / "metrics.jsonl") if "step_s" in r]
    step_s = sorted(r["step_s"] for r in records)[len(records) // 2]
    assert time.perf_counter() - started < JOB_SECONDS, "this machine is too slow for 1-minute jobs"
    # more than one job's worth of steps, so that the chain has to resume, but fewer than two
    # jobs can do, so that the third is cancelled
    steps = math.ceil(1.4 * TRAINING_SECONDS_PER_JOB / step_s)
    run = tmp_path / "run"
    written = subprocess.run(
        [sys.executable, "-m", "tuneforge", "slurm", str(DEMO), *overrides(run, steps), *extra,
         "--jobs", "3", "--time", "00:01:00", "--out", str(tmp_path / "chain"), *chain],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    script = (tmp_path / "chain" / "train.sbatch").read_text()
    assert (
        f"RUN_DIR={run}" in script
        and "SLURM_JOB_ID" not in script.split("RUN_DIR=")[1].split("\n")[0]
    )
    assert subprocess.run(["bash", "-n", str(tmp_path / "chain" / "train.sbatch")]).returncode == 0
    queued = subprocess.run(
        ["bash", str(tmp_path / "chain" / "submit.sh")], capture_output=True, text=True
    )
    assert queued.returncode == 0, queued.stderr
    jobs = queued.stdout.split()
    assert len(jobs) == 3
    deadline = time.time() + 6 * JOB_SECONDS
    while time.time() < deadline:
        active = subprocess.run(
            ["squeue", "-h", "-j", ",".join(jobs)], capture_output=True, text=True
        )
        if not active.stdout.strip():
            break
        time.sleep(2)
    else:
        pytest.fail("the chain did not end in time")
    log = [json.loads(line) for line in (run / "jobs.jsonl").read_text().splitlines()]
    return run, steps, log, jobs


def assert_resumed_to_the_end(run: Path, steps: int, log: list[dict], jobs: list[str]) -> None:
    metrics = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert (run / "finished").is_file() and metrics[-1]["step"] == steps
    assert [r["step"] for r in metrics] == list(range(1, steps + 1))  # no step lost or repeated
    assert len(log) >= 2, f"expected the run to need more than one job: {log}"
    assert log[0]["first_step"] == 0
    for previous, current in itertools.pairwise(log):
        assert current["first_step"] == previous["last_step"] > 0  # resumed, never from step 0
    assert log[-1]["last_step"] == steps
    for job in jobs[len(log) :]:  # the jobs after the finishing one never ran
        assert job_state(job) == "CANCELLED", (job, job_state(job))


@pytest.mark.skipif(slurm_ready() is not None, reason=str(slurm_ready()))
def test_a_three_job_chain_resumes_and_stops_when_done(tmp_path):
    run, steps, log, jobs = run_chain(tmp_path, [], 1, [])
    assert all(entry["exit"] in (0, 75) for entry in log), log
    assert_resumed_to_the_end(run, steps, log, jobs)


@pytest.mark.skipif(slurm_nodes() < 2, reason="fewer than two SLURM nodes (.ci/slurm-up.sh)")
def test_a_two_node_chain_replicates_across_nodes_and_trains_as_one_process(tmp_path):
    """Two nodes, one gloo rank each, started by torchrun through srun with the rendezvous
    taken from SLURM's variables: HSDP with one replica per node. Its losses, over every job,
    are those of one process over the same global batch (two micro-batches a step)."""
    hsdp = ["parallel.data_parallel_replicate=2", "train.grad_accum_steps=1"]
    run, steps, log, jobs = run_chain(tmp_path, hsdp, 2, ["--nodes", "2", "--procs-per-node", "1"])
    assert_resumed_to_the_end(run, steps, log, jobs)
    assert "hsdp 2×1" in (run / next(p.name for p in run.glob("slurm-*.out"))).read_text()
    one = tmp_path / "one"
    alone = [*overrides(one, steps), "train.grad_accum_steps=2", "train.time_limit=null"]
    done = subprocess.run(
        [sys.executable, "-m", "tuneforge", "train", str(DEMO), *alone],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    expected = [r["loss"] for r in read_metrics(one / "metrics.jsonl") if "loss" in r]
    got = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert got == pytest.approx(expected, rel=1e-4)
