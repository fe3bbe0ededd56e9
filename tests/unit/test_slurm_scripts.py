"""Generated sbatch scripts: valid bash, a fixed run directory, the launcher for the topology,
the environment, the signal, and the chain's submission with afterany dependencies."""

import json
import subprocess
from pathlib import Path

import pytest

from tuneforge.config import load_config
from tuneforge.slurm.chain import ChainSpec, write_chain
from tuneforge.slurm.status import chain_status

DEMO = Path("examples/demo.yaml")


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 0), (1, 8), (4, 8)])
def test_scripts_are_valid_bash_with_a_fixed_run_directory(tmp_path, nodes, gpus):
    overrides = [f"run.output_dir={tmp_path / 'run'}", "run.env={NCCL_SOCKET_IFNAME: hsn0}"]
    config = load_config(DEMO, overrides)
    spec = ChainSpec(
        DEMO,
        overrides,
        6,
        "38:00:00",
        nodes,
        gpus,
        "standard-g",
        "project_1",
        {"HF_HOME": "/scratch/hf"},
    )
    script, submit = write_chain(spec, config, tmp_path / "chain")
    for file in (script, submit):
        assert subprocess.run(["bash", "-n", str(file)]).returncode == 0
    text = script.read_text()
    assert f"RUN_DIR={tmp_path / 'run'}" in text and "$SLURM_JOB_ID/" not in text
    assert "#SBATCH --time=1-14:00:00" in text and "#SBATCH --signal=B:USR1@120" in text
    assert "#SBATCH --partition=standard-g" in text and "#SBATCH --account=project_1" in text
    assert "export NCCL_SOCKET_IFNAME=hsn0" in text and "export HF_HOME=/scratch/hf" in text
    assert "export PYTORCH_ALLOC_CONF=expandable_segments:True" in text
    assert "--resume auto" in text and "scancel --name=tf-demo --state=PENDING" in text
    if nodes > 1:  # each node's torchrun takes its rank from its own task's SLURM_NODEID
        launch = next(line for line in text.splitlines() if line.startswith("srun "))
        assert launch.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '")
        assert "--nnodes=$SLURM_NNODES --node_rank=$SLURM_NODEID --nproc_per_node=8" in launch
        assert "--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT" in launch
        assert "export MASTER_PORT=" in text and "NodeAddr=" in text
    elif gpus:
        assert "-m torch.distributed.run --standalone --nproc_per_node=8" in text
    submission = submit.read_text()
    assert "--dependency=afterany:" in submission and "seq 2 6" in submission
    assert (tmp_path / "run").is_dir()  # SLURM opens the output file there


def test_status_reads_jobs_and_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "jobs.jsonl").write_text(
        json.dumps({"job": "11", "first_step": 0, "last_step": 40, "exit": 75})
        + "\n"
        + json.dumps({"job": "12", "first_step": 40, "last_step": 60, "exit": 0})
        + "\n"
    )
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "loss": 1.0, "tokens_per_s": 100.0 + s, "eta_s": 60 - s}) + "\n"
            for s in range(1, 61)
        )
    )
    (run / "finished").write_text("60\n")
    status = chain_status(run)
    assert status.steps_done == 60 and status.finished and len(status.jobs) == 2
    assert status.tokens_per_s == pytest.approx(150.5) and status.state == "finished"


def test_status_before_the_first_logged_step_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert chain_status(run).state == "not started"
    from tuneforge.config import dump_config

    (run / "config.yaml").write_text(dump_config(load_config(DEMO, [])))
    assert chain_status(run).state == "no step logged yet"


def test_a_relative_run_directory_is_pinned_absolute_in_the_jobs_command(tmp_path, monkeypatch):
    """A chain submitted from another directory still trains into the run directory it was
    written for (run.output_dir relative, or unset: runs/<name>)."""
    monkeypatch.chdir(tmp_path)
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
    config = load_config(demo, [])
    spec = ChainSpec(demo, [], 2, "01:00:00", 1, 0, None, None, {})
    script, _ = write_chain(spec, config, tmp_path / "chain")
    pinned = tmp_path / "runs" / "demo"
    assert f"run.output_dir={pinned}" in script.read_text()
    train_line = next(line for line in script.read_text().splitlines() if "tuneforge train" in line)
    assert train_line.index("run.output_dir=") < train_line.index("--resume auto")
