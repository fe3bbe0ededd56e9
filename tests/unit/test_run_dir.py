"""The run directory on `--overwrite`: the previous run's files go once the new run is set up,
and come back if it is not; nothing else in the directory is touched."""

import pytest

from tuneforge.errors import TuneforgeError
from tuneforge.runs.run_dir import prepare_run_dir, replacing


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
        prepare_run_dir(run_dir, "never", overwrite=False)
    assert prepare_run_dir(run_dir, "never", overwrite=True) is None
    assert names(run_dir) == [".replaced", "notes.md", "slurm-123.out"]
    with replacing(run_dir, True, replaced=True):
        (run_dir / "config.yaml").write_text("the new run")
    assert names(run_dir) == ["config.yaml", "notes.md", "slurm-123.out"]
    assert (run_dir / "slurm-123.out").read_text() == "the job writing this log is still running"


def names(run_dir) -> list[str]:
    return sorted(entry.name for entry in run_dir.iterdir())


def contents(run_dir) -> dict[str, bytes]:
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def test_a_new_run_that_stops_in_its_setup_gives_the_previous_run_back(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous_run(run_dir)
    before = contents(run_dir)
    prepare_run_dir(run_dir, "never", overwrite=True)
    with (
        pytest.raises(TuneforgeError, match="bad data"),
        replacing(run_dir, True, replaced=True),
    ):
        (run_dir / "checkpoints").mkdir()
        (run_dir / "metrics.jsonl").write_text("the new run")
        raise TuneforgeError("bad data")
    assert contents(run_dir) == before
    assert ".replaced" not in names(run_dir)


def test_a_setup_that_set_nothing_aside_leaves_the_directory_alone(tmp_path):
    """A resumed run's setup that stops touches nothing, not even a folder set aside earlier
    by an interrupted `--overwrite`."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous_run(run_dir)
    (run_dir / ".replaced").mkdir()
    (run_dir / ".replaced" / "config.yaml").write_text("older")
    before = contents(run_dir)
    with pytest.raises(KeyboardInterrupt), replacing(run_dir, True, replaced=False):
        raise KeyboardInterrupt
    assert contents(run_dir) == before
