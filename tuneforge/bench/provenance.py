"""Where a benchmark's raw results go and what they were measured on: a folder outside the
checkout by default, and the tuneforge commit each result file records (so that a curated table
can name it)."""

import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
"""The directory holding the `tuneforge` package: a git checkout's root when run from one."""


def default_results_dir() -> Path:
    """`$XDG_DATA_HOME/tuneforge/bench` (`~/.local/share/tuneforge/bench`): results are data a
    user keeps, not part of the source tree."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "tuneforge" / "bench"


def tuneforge_commit(source: Path = SOURCE) -> str:
    """The commit of the checkout tuneforge runs from (`source`), `+dirty` where tracked files
    differ from it; the installed version where it is not a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10,
            check=True,
        ).stdout.strip()  # fmt: skip

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        try:
            return f"tuneforge {version('tuneforge')} (not a git checkout)"
        except PackageNotFoundError:
            return "unknown"
    return commit + ("+dirty" if dirty else "")
