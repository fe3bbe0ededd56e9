"""Tokenised datasets cached on disk as memory-mapped arrays, keyed by everything they depend on.

The key hashes the contents of every source file (not only its name), the format options, the
tokenizer's files and chat template, the length policy, `CACHE_VERSION`, the source of the
modules that turn records into tokens and the tokenizer libraries' versions (an upgrade that
changes how documents are built never reads an entry the old code wrote). An entry is a
directory of `input_ids.npy`, `loss_mask.npy`, `offsets.npy` and `meta.json`, written to a
temporary directory and renamed into place when complete; a failed build writes nothing.
Where the documents keep their records' other fields, `fields.jsonl` holds them, a line each.
"""

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tuneforge.config.sections.data import DataSource
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.records import expand_paths
from tuneforge.data.splits import file_digest
from tuneforge.data.token_store import TokenStore
from tuneforge.file_modes import follow_umask

log = logging.getLogger(__name__)

CACHE_VERSION = 4  # 4: a preference pair carries its margin
DOCUMENT_CODE = Path(__file__).parent
"""The modules that read records and build their token documents (this package), hashed into
the key: bumping `CACHE_VERSION` by hand is no longer the only guard against stale entries."""
TOKENIZER_LIBRARIES = ("tokenizers", "transformers")
FIELDS_FILE = "fields.jsonl"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tuneforge" / "tokenized"


def cache_key(sources: list[DataSource], tokenizer, options: dict) -> str:
    """Hash of source contents, format options, tokenizer files and template, and `options`."""
    digest = hashlib.sha256(f"tuneforge-tokenized-v{CACHE_VERSION}".encode())
    for source in sources:
        for file in expand_paths(source.files):
            digest.update(
                f"{file.name}:{file_digest(file)}:{source.format}:{source.subset}:{source.split}:"
                f"{sorted(source.field_map.items())}".encode()
            )
        if source.metadata is not None:
            digest.update(f"metadata:{file_digest(source.metadata)}".encode())
    tokenizer_dir = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            digest.update(f"{name}:{file_digest(tokenizer_dir / name)}".encode())
    digest.update(str(tokenizer.chat_template).encode())
    digest.update(f"{len(tokenizer)}:{tokenizer.eos_token_id}".encode())
    digest.update(json.dumps(options, sort_keys=True).encode())
    digest.update(code_digest().encode())
    return digest.hexdigest()[:32]


def code_digest() -> str:
    """Hash of the document-building modules' source and of the tokenizer libraries' versions."""
    digest = hashlib.sha256()
    for file in sorted(DOCUMENT_CODE.glob("*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    for library in TOKENIZER_LIBRARIES:
        digest.update(f"{library}={importlib.metadata.version(library)}".encode())
    return digest.hexdigest()


def load_cached(directory: Path) -> tuple[TokenStore, DatasetStats] | None:
    if not (directory / "meta.json").is_file():
        return None
    meta = json.loads((directory / "meta.json").read_text())
    fields_file = directory / FIELDS_FILE
    fields = None
    if fields_file.is_file():
        fields = [json.loads(line) for line in fields_file.read_text().splitlines()]
    store = TokenStore(
        np.load(directory / "input_ids.npy", mmap_mode="r"),
        np.load(directory / "loss_mask.npy", mmap_mode="r"),
        np.load(directory / "offsets.npy"),
        fields,
    )
    return store, DatasetStats.from_dict(meta["stats"])


def write_directory(directory: Path, fill: Callable[[Path], None]) -> None:
    """`fill(partial)` writes the directory's files into a temporary one, renamed into place when
    complete: a failure leaves nothing, and another process that finished the same entry first
    keeps it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        fill(partial)
        follow_umask(partial)
        try:
            partial.rename(directory)
        except OSError:  # another process finished the same entry first
            shutil.rmtree(partial, ignore_errors=True)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def save_cached(directory: Path, store: TokenStore, stats: DatasetStats) -> None:
    def fill(partial: Path) -> None:
        np.save(partial / "input_ids.npy", np.asarray(store.input_ids))
        np.save(partial / "loss_mask.npy", np.asarray(store.loss_mask))
        np.save(partial / "offsets.npy", np.asarray(store.offsets))
        if store.fields is not None:  # JSON values already (`dataset.json_values`)
            lines = (json.dumps(fields) + "\n" for fields in store.fields)
            (partial / FIELDS_FILE).write_text("".join(lines))
        meta = {"version": CACHE_VERSION, "stats": dataclasses.asdict(stats)}
        (partial / "meta.json").write_text(json.dumps(meta))

    write_directory(directory, fill)


def cached_examples(
    sources: list[DataSource], tokenizer, options: dict, cache_dir: Path | None, build
) -> tuple[TokenStore, DatasetStats]:
    """The tokenised examples of `sources` from the cache, or from `build()` (then cached).
    `build` returns `(examples, stats)`; with `cache_dir=None` nothing is cached."""
    if cache_dir is None:
        examples, stats = build()
        return TokenStore.from_examples(examples), stats
    directory = cache_dir / cache_key(sources, tokenizer, options)
    try:
        hit = load_cached(directory)
    except (OSError, ValueError, KeyError, TypeError) as error:  # a damaged entry is rebuilt
        log.warning("data cache %s cannot be read (%s): tokenising again", directory, error)
        hit = None
    if hit is not None:
        log.info("tokenised data from cache %s", directory)
        return hit
    examples, stats = build()
    store = TokenStore.from_examples(examples)
    try:
        save_cached(directory, store, stats)
    except OSError as error:
        log.warning(
            "data.cache_dir: cannot write %s (%s): the tokenised data is not cached; set "
            "data.cache_dir to a writable place to reuse it",
            directory,
            error.strerror or error,
        )
    else:
        log.info("tokenised data cached in %s", directory)
    return store, stats
