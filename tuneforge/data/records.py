"""Read records from local files: `.jsonl`, `.json` (a list), `.parquet`, a dataset saved with
`datasets.save_to_disk`, a directory or a glob of them.

Every problem names the file and line (or row) and the reason.
"""

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuneforge.errors import TuneforgeError

SUFFIXES = (".jsonl", ".json", ".parquet", ".npy")


class DataError(TuneforgeError):
    """A data file that cannot be used as it is."""

    field = "data.train"
    """The configuration field whose data it is (`data.eval` for the held-out files)."""


ORIGIN_FIELD = "__origin__"
"""Where a record's kept fields (`Conversation.fields`, for rewards) hold its `file:line`, so that
a value computed from the record can name it; not one of the record's own fields."""


class RecordError(TuneforgeError):
    """One record that cannot be used; the message says which field and why."""


@dataclass(frozen=True)
class Conversation:
    """One training document: chat messages, or raw text trained on every token."""

    messages: list[dict[str, str]]
    origin: str
    """`file:line` the record came from."""
    text: str | None = None
    rejected: str | None = None
    """For preference records: the rejected reply (`messages` ends with the chosen one)."""
    desirable: bool | None = None
    """For unpaired records (format unpaired): whether the reply is one to learn (KTO's label)."""
    pretokenized: "tuple[np.ndarray, np.ndarray] | None" = None
    """(token ids, loss mask) of a document that comes tokenised (format mlperf)."""
    is_prompt: bool = False
    """A prompt alone, to be answered (format `prompt`): rendered with the generation prompt,
    nothing in it trained."""
    fields: dict[str, object] | None = None
    """The record's fields that its format does not read (a reward function's reference
    values, such as a solution or test cases)."""


def is_saved_dataset(path: Path) -> bool:
    """A directory written by `datasets.Dataset.save_to_disk`."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def expand_paths(path: Path) -> list[Path]:
    """The data files a source names: itself, the data files of a directory, or a glob's matches.
    A dataset saved with `save_to_disk` counts as one file."""
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if is_saved_dataset(p))
        raise DataError(
            f"{path} holds a DatasetDict with splits {', '.join(splits) or '(none)'}: "
            f"point the path at one split, e.g. {path / ('train' if 'train' in splits or not splits else splits[0])}"
        )
    if path.is_dir() and is_saved_dataset(path):
        return [path]
    if any(char in str(path) for char in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    elif path.is_dir():
        saved = {p.parent for p in path.rglob("state.json") if is_saved_dataset(p.parent)}
        files = sorted(
            [
                p
                for p in path.rglob("*")
                if p.suffix in SUFFIXES and p.is_file() and not saved.intersection(p.parents)
            ]
            + list(saved)
        )
    else:
        files = [path]
    if not files:
        raise DataError(f"{path}: no data files ({', '.join(SUFFIXES)}) found")
    return files


def iter_raw_records(file: Path) -> Iterator[tuple[object, str]]:
    """(record, origin) pairs of one file; malformed lines raise `RecordError` via the origin."""
    if file.is_dir() and is_saved_dataset(file):
        yield from _saved_dataset_records(file)
        return
    if not file.is_file():
        raise DataError(f"{file}: no such file")
    if file.suffix == ".npy":
        raise DataError(
            f"{file}: a .npy holds pre-tokenised packs: set the source's format: mlperf"
        )
    if file.suffix == ".parquet":
        yield from _parquet_records(file)
        return
    data = file.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is harmless: skip it
        data = data[3:]
    if not data.strip():
        raise DataError(f"{file}: the file is empty")
    if file.suffix == ".json":
        yield from _json_list_records(file, data)
        return
    for number, raw_line in enumerate(data.split(b"\n"), start=1):
        origin = f"{file}:{number}"
        if not raw_line.strip():
            continue
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            yield (
                RecordError(
                    f"not valid UTF-8 (byte 0x{raw_line[error.start]:02x} at column {error.start + 1})"
                ),
                origin,
            )
            continue
        try:
            yield json.loads(line), origin
        except json.JSONDecodeError as error:
            yield RecordError(f"invalid JSON ({error.msg} at column {error.colno})"), origin


def _json_list_records(file: Path, data: bytes) -> Iterator[tuple[object, str]]:
    try:
        records = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise DataError(f"{file}: not valid UTF-8 (byte offset {error.start})") from None
    except json.JSONDecodeError as error:
        raise DataError(
            f"{file}:{error.lineno}: invalid JSON ({error.msg} at column {error.colno})"
        ) from None
    if not isinstance(records, list):
        raise DataError(
            f"{file}: a .json data file must hold a list of records (use .jsonl for one per line)"
        )
    for index, record in enumerate(records):
        yield record, f"{file}[{index}]"


def _parquet_records(file: Path) -> Iterator[tuple[object, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{file}: reading .parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(file)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise DataError(f"{file}: not a readable parquet file ({error})") from None
    for index, record in enumerate(table.to_pylist()):
        yield record, f"{file} row {index}"


def iter_hub_records(
    snapshot: Path, name: str, subset: str | None, split: str
) -> Iterator[tuple[object, str]]:
    """(record, origin) of one split of a hub dataset's snapshot, read by `datasets` as the hub
    would read it (its README's subsets and splits), from the local files only."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{snapshot}: a hub data source is read with the datasets package "
            "(pip install 'tuneforge[datasets]')"
        ) from None
    cache = os.environ.get("HF_DATASETS_CACHE")
    try:
        dataset = datasets.load_dataset(str(snapshot), subset, split=split, cache_dir=cache)
    except ValueError as error:  # an unknown subset or split names the ones there are
        raise DataError(f"{name} ({snapshot}): {error}") from None
    for index, record in enumerate(dataset):
        yield record, f"{name} ({subset or 'default'}, {split}) row {index}"


def _saved_dataset_records(directory: Path) -> Iterator[tuple[object, str]]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{directory}: reading a dataset saved with save_to_disk needs the datasets package "
            "(pip install datasets)"
        ) from None
    try:
        dataset = datasets.load_from_disk(str(directory))
    except Exception as error:  # datasets raises several types for damaged directories
        raise DataError(f"{directory}: not a readable saved dataset ({error})") from None
    for index, record in enumerate(dataset):
        yield record, f"{directory} row {index}"
