"""Where a run's checkpoints lie, which of them are intact, and where a damaged one is kept.

A checkpoint's `state.json` is written last and lists the size of every other file in it, so a
file cut short (a job killed while the file system still flushed it, a full disk) or lost is
found before anything is loaded from it."""

import json
from pathlib import Path

from tuneforge.runs.files import CHECKPOINTS, LATEST, STATE_FILE

DAMAGED_DIR = "damaged"
"""In `CHECKPOINTS`: damaged checkpoints, kept for inspection, never resumed from."""


def file_sizes(checkpoint: Path) -> dict[str, int]:
    """Every file in `checkpoint` (its relative path) and its size in bytes."""
    return {
        path.relative_to(checkpoint).as_posix(): path.stat().st_size
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file()
    }


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("_")[1])


def damage(checkpoint: Path) -> str | None:
    """What is wrong with a complete checkpoint's files, or None where nothing is."""
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{STATE_FILE} cannot be read ({error})"
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict):
        return None  # written before checkpoints listed their files
    for name, size in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        found = path.stat().st_size
        if found != size:
            return f"{name} holds {found:,} of its {size:,} bytes"
    return None


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints with their state written, newest first: the `latest` pointer's, then the
    others by step."""
    root = run_dir / CHECKPOINTS
    complete = sorted(
        (p for p in root.glob("step_*") if (p / STATE_FILE).is_file()), key=step_of, reverse=True
    )
    try:
        pointed = root / json.loads((root / LATEST).read_text())["path"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return complete
    if pointed in complete:
        complete.remove(pointed)
        complete.insert(0, pointed)
    return complete


def newest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint (None if there is none), and the newer damaged ones with
    what is wrong with each."""
    damaged: list[tuple[Path, str]] = []
    for checkpoint in complete_checkpoints(run_dir):
        problem = damage(checkpoint)
        if problem is None:
            return checkpoint, damaged
        damaged.append((checkpoint, problem))
    return None, damaged


def keep_aside(checkpoint: Path) -> Path:
    """Move a damaged checkpoint to `checkpoints/damaged/`; returns where it went."""
    aside = checkpoint.parent / DAMAGED_DIR
    aside.mkdir(exist_ok=True)
    target, copies = aside / checkpoint.name, 1
    while target.exists():
        copies += 1
        target = aside / f"{checkpoint.name}.{copies}"
    checkpoint.rename(target)
    return target
