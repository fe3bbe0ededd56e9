"""Tokenised datasets cached on disk as memory-mapped arrays, keyed by everything they depend on.

The key hashes the contents of every source file (not only its name), the format options, the
tokenizer's files and chat template, the length policy and `CACHE_VERSION`. An entry is a
directory of `input_ids.npy`, `loss_mask.npy`, `offsets.npy` and `meta.json`, written to a
temporary directory and renamed into place when complete; a failed build writes nothing.
"""

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tuneforge.data.dataset import DatasetStats
from tuneforge.data.packing import IGNORE_INDEX, Example
from tuneforge.data.records import expand_paths
from tuneforge.data.splits import file_digest

log = logging.getLogger(__name__)

CACHE_VERSION = 1
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tuneforge" / "tokenized"


class TokenStore:
    """Examples backed by flat arrays: `input_ids`, `loss_mask` and document `offsets`."""

    def __init__(self, input_ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray) -> None:
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.offsets = offsets
        self.lengths = np.diff(offsets).tolist()

    @classmethod
    def from_examples(cls, examples: list[Example]) -> "TokenStore":
        offsets = np.zeros(len(examples) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(example.input_ids) for example in examples])
        input_ids = np.fromiter(
            (t for ex in examples for t in ex.input_ids), dtype=np.int32, count=int(offsets[-1])
        )
        # a token is a target when the label of the token before it is not IGNORE_INDEX
        mask = np.zeros(int(offsets[-1]), dtype=np.bool_)
        for index, example in enumerate(examples):
            start = int(offsets[index])
            labels = np.asarray(example.labels[:-1])
            mask[start + 1 : start + len(example.input_ids)] = labels != IGNORE_INDEX
        return cls(input_ids, mask, offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Example:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        ids = self.input_ids[start:end].tolist()
        mask = self.loss_mask[start:end].tolist()
        return Example(
            ids,
            [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
            + [IGNORE_INDEX],
        )


def cache_key(sources: list[tuple], tokenizer, options: dict) -> str:
    """Hash of source contents, format options, tokenizer files and template, and `options`."""
    digest = hashlib.sha256(f"tuneforge-tokenized-v{CACHE_VERSION}".encode())
    for path, format_name, field_map in sources:
        for file in expand_paths(Path(path)):
            digest.update(
                f"{file.name}:{file_digest(file)}:{format_name}:{sorted(field_map.items())}".encode()
            )
    tokenizer_dir = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            digest.update(f"{name}:{file_digest(tokenizer_dir / name)}".encode())
    digest.update(str(tokenizer.chat_template).encode())
    digest.update(f"{len(tokenizer)}:{tokenizer.eos_token_id}".encode())
    digest.update(json.dumps(options, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def load_cached(directory: Path) -> tuple[TokenStore, DatasetStats] | None:
    if not (directory / "meta.json").is_file():
        return None
    meta = json.loads((directory / "meta.json").read_text())
    store = TokenStore(
        np.load(directory / "input_ids.npy", mmap_mode="r"),
        np.load(directory / "loss_mask.npy", mmap_mode="r"),
        np.load(directory / "offsets.npy"),
    )
    return store, DatasetStats(**meta["stats"])


def save_cached(directory: Path, store: TokenStore, stats: DatasetStats) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        np.save(partial / "input_ids.npy", np.asarray(store.input_ids))
        np.save(partial / "loss_mask.npy", np.asarray(store.loss_mask))
        np.save(partial / "offsets.npy", np.asarray(store.offsets))
        meta = {"version": CACHE_VERSION, "stats": dataclasses.asdict(stats)}
        (partial / "meta.json").write_text(json.dumps(meta))
        try:
            partial.rename(directory)
        except OSError:  # another process finished the same entry first
            shutil.rmtree(partial, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def cached_examples(
    sources: list[tuple], tokenizer, options: dict, cache_dir: Path | None, build
) -> tuple[TokenStore, DatasetStats]:
    """The tokenised examples of `sources` from the cache, or from `build()` (then cached).
    `build` returns `(examples, stats)`; with `cache_dir=None` nothing is cached."""
    if cache_dir is None:
        examples, stats = build()
        return TokenStore.from_examples(examples), stats
    directory = cache_dir / cache_key(sources, tokenizer, options)
    hit = load_cached(directory)
    if hit is not None:
        log.info("tokenised data from cache %s", directory)
        return hit
    examples, stats = build()
    store = TokenStore.from_examples(examples)
    save_cached(directory, store, stats)
    log.info("tokenised data cached in %s", directory)
    return store, stats
