"""Held-out data: a seeded fraction of the training records, and a guard against an evaluation
source that is secretly the training file."""

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from tuneforge.data.records import DataError, expand_paths

T = TypeVar("T")


def split_off(conversations: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """(train, held-out): a seeded random `fraction` of the records, at least one, never all."""
    count = min(len(conversations) - 1, max(1, round(len(conversations) * fraction)))
    if count < 1:
        raise DataError("data.eval_fraction needs at least two training records")
    chosen = set(random.Random(seed).sample(range(len(conversations)), count))
    held_out = [c for i, c in enumerate(conversations) if i in chosen]
    return [c for i, c in enumerate(conversations) if i not in chosen], held_out


def file_digest(file: Path) -> str:
    """SHA-256 of a file's contents; of a directory (a saved dataset), of its files' names and
    contents."""
    digest = hashlib.sha256()
    if file.is_dir():
        for member in sorted(p for p in file.rglob("*") if p.is_file()):
            digest.update(f"{member.relative_to(file)}:{file_digest(member)}".encode())
        return digest.hexdigest()
    with file.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_disjoint_files(train: list[Path], evaluation: list[Path]) -> None:
    """An evaluation file with the same contents as a training file is an error."""
    train_digests = {file_digest(f): f for path in train for f in expand_paths(path)}
    for path in evaluation:
        for file in expand_paths(path):
            twin = train_digests.get(file_digest(file))
            if twin is not None:
                raise DataError(
                    f"evaluation file {file} has the same contents as training file {twin}: "
                    "held-out loss on training data means nothing; use another file or data.eval_fraction"
                )
