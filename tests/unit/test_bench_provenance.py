"""A benchmark's raw results name the commit they were measured on, and go outside the checkout
unless told otherwise."""

import subprocess
from pathlib import Path

from tuneforge.bench import provenance


def _git(directory, *args: str) -> str:
    command = ["git", "-C", str(directory), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_is_the_checkouts_marked_dirty_where_tracked_files_changed(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "tuneforge").mkdir(parents=True)
    source = checkout / "tuneforge" / "__init__.py"
    source.write_text("")
    assert "not a git checkout" in provenance.tuneforge_commit(checkout)
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "one")
    head = _git(checkout, "rev-parse", "HEAD")
    (checkout / "results.json").write_text("{}")  # untracked: still clean
    assert provenance.tuneforge_commit(checkout) == head
    source.write_text("# changed\n")
    assert provenance.tuneforge_commit(checkout) == head + "+dirty"
    assert (
        Path(provenance.__file__).resolve()
        == provenance.SOURCE / "tuneforge" / "bench" / "provenance.py"
    )


def test_results_go_to_the_users_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert provenance.default_results_dir() == tmp_path / "tuneforge" / "bench"
