"""The run directory on `--overwrite`: the previous run's files go, nothing else does."""

import pytest

from tuneforge.errors import TuneforgeError
from tuneforge.train.distributed import Dist
from tuneforge.train.run_dir import prepare_run_dir


def previous_run(run_dir):
    """A finished run's files, and two that are not the run's: a job's log and a note."""
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_2" / "state.json").write_text("{}")
    (run_dir / "final").mkdir()
    (run_dir / "final" / "model.safetensors").write_bytes(b"weights")
    (run_dir / "tensorboard").mkdir()
    for name in ("config.yaml", "metrics.jsonl", "finished", "jobs.jsonl"):
        (run_dir / name).write_text("x")
    (run_dir / "slurm-123.out").write_text("the job writing this log is still running")
    (run_dir / "notes.md").write_text("why this run")


def test_overwrite_removes_the_previous_run_and_keeps_what_is_not_its_own(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous_run(run_dir)
    with pytest.raises(TuneforgeError, match="already holds a run"):
        prepare_run_dir(run_dir, "never", overwrite=False, world=Dist())
    assert prepare_run_dir(run_dir, "never", overwrite=True, world=Dist()) is None
    assert sorted(entry.name for entry in run_dir.iterdir()) == ["notes.md", "slurm-123.out"]
    assert (run_dir / "slurm-123.out").read_text() == "the job writing this log is still running"
