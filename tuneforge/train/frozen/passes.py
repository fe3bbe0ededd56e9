"""One pass of a frozen model over every training document before the first step, its results
kept on disk and carried with each batch (`data/side_data.py`): a precomputed reference's
log-probability of each reply, a cached teacher's top-k logits of each supervised token.

An entry is keyed by what it depends on — the tokenised documents' contents and the frozen
model's identity — and written to a temporary directory renamed into place, so a pass that
stops leaves nothing half-written. The main rank computes it; the others wait and read it.
A precomputed reference's values are also kept in the run directory (after a resume the model
is no longer the reference), with the held-out batches' values, computed at each fresh start."""

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.model import ModelSection
from tuneforge.data.cache import default_cache_dir, write_directory
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch, PackedLoader, collate_from
from tuneforge.data.splits import file_digest
from tuneforge.data.token_store import TokenStore
from tuneforge.errors import TuneforgeError
from tuneforge.parallel.distributed import Dist, barrier

log = logging.getLogger(__name__)

PASS_VERSION = 1


@dataclass
class FrozenPassData:
    """What a pass runs over and where its results go."""

    loader: PackedLoader
    eval_batches: list[PackedBatch]
    run_dir: Path
    world: Dist
    config: RunConfig


def store_digest(store: TokenStore) -> str:
    digest = hashlib.sha256()
    for array in (store.input_ids, store.loss_mask, store.offsets):
        contents = np.ascontiguousarray(array)
        for start in range(0, len(contents), 1 << 24):
            digest.update(contents[start : start + (1 << 24)].tobytes())
    return digest.hexdigest()


def batches_digest(batches: list[PackedBatch]) -> str:
    digest = hashlib.sha256()
    for batch in batches:
        for tensor in (batch.tokens, batch.labels, batch.packed.cu_seqlens):
            digest.update(tensor.cpu().numpy().tobytes())
    return digest.hexdigest()


def model_identity(section: ModelSection, seed: int) -> str:
    """A model's section (dtype, shape, initialisation), the seed, and its weights' contents."""
    weights = file_digest(Path(section.path)) if section.path is not None else ""
    return f"{section.model_dump_json()}:{seed}:{weights}"


def entry_key(*parts: str) -> str:
    digest = hashlib.sha256(f"tuneforge-frozen-pass-v{PASS_VERSION}".encode())
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def entry_dir(data: FrozenPassData, kind: str, key: str) -> Path:
    """In the tokenised data's cache, or in the run directory when that cache is off."""
    section = data.config.data
    if not section.cache:
        return data.run_dir / kind / key
    return (section.cache_dir or default_cache_dir()) / kind / key


def bins_on(loader: PackedLoader, device: torch.device) -> Iterator[tuple[list[int], PackedBatch]]:
    for indexes in loader.bins:
        yield indexes, collate_from(loader.store, indexes, loader.padded).to(device)


def write_entry(directory: Path, fill: Callable[[Path], None]) -> None:
    """`fill(partial)` writes the entry's files; `complete.json` marks it whole."""

    def complete(partial: Path) -> None:
        fill(partial)
        (partial / "complete.json").write_text(json.dumps({"version": PASS_VERSION}))

    write_directory(directory, complete)


def on_main_then_all(data: FrozenPassData, directory: Path, compute: Callable[[Path], None]):
    """The main rank computes the entry unless it is there; every rank then finds it (or every
    rank stops with the reason, none left waiting)."""
    problem = None
    if data.world.is_main and not (directory / "complete.json").is_file():
        try:
            write_entry(directory, compute)
        except OSError as error:
            problem = TuneforgeError(
                f"cannot write the frozen pass's results to {directory} "
                f"({error.strerror or error}): set data.cache_dir to a writable place with room "
                "for them (or data.cache: false to keep them in the run directory)"
            )
    barrier()
    if problem is not None:
        raise problem
    if not (directory / "complete.json").is_file():
        raise TuneforgeError(f"{directory}: the frozen pass's results are missing or incomplete")


def supervised_rows(batch: PackedBatch) -> torch.Tensor:
    return (batch.labels != IGNORE_INDEX).nonzero().squeeze(-1)


def document_rows(offsets: np.ndarray, indexes: list[int]) -> np.ndarray:
    """The store-wide rows of the documents' supervised tokens, in the batch's order."""
    return np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indexes])
