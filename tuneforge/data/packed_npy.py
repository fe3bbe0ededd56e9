"""Pre-tokenised packed data in the mlperf layout (as NeMo and Primus write it): a `.npy` array
with one dict per pack holding `input_ids`, `loss_mask` (1 where the token is a target) and
`seq_start_id` (where each document starts), optionally with a metadata JSON.

Packs are cut at `seq_start_id`, so no document attends to another (Primus reads the same files
and ignores the boundaries). The array holds pickled Python objects; it is read with an unpickler
that admits numpy arrays and plain containers only, so such a file cannot run code.
"""

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tuneforge.data.records import Conversation, DataError, RecordError

FIELDS = ("input_ids", "loss_mask", "seq_start_id")
SAFE_GLOBALS = {
    (module, name)
    for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("_reconstruct", "scalar")
} | {("numpy", "ndarray"), ("numpy", "dtype")}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it references {module}.{name}, which is not data")


def load_packs(file: Path) -> np.ndarray:
    """The array in `file`; object arrays through the restricted unpickler."""
    with file.open("rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                _, _, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                _, _, dtype = np.lib.format.read_array_header_2_0(handle)
        except ValueError as error:
            raise DataError(f"{file}: not a .npy file ({error})") from None
        if not dtype.hasobject:
            raise DataError(
                f"{file}: holds a plain {dtype} array; format mlperf expects one dict per pack "
                f"with {', '.join(FIELDS)}"
            )
        try:
            packs = _ArrayUnpickler(handle).load()
        except Exception as error:  # any damage or disallowed content: refuse the file
            raise DataError(f"{file}: cannot be read safely as packed data ({error})") from None
    if not isinstance(packs, np.ndarray) or packs.ndim != 1:
        raise DataError(f"{file}: expected a 1-D array of packs")
    return packs


def _int_array(pack: dict, key: str) -> np.ndarray:
    if key not in pack:
        raise RecordError(f'missing field "{key}"')
    try:
        values = np.asarray(pack[key])
    except (TypeError, ValueError):
        raise RecordError(f'field "{key}" must be a list of integers') from None
    if values.ndim != 1 or not (np.issubdtype(values.dtype, np.integer) or values.dtype == bool):
        raise RecordError(f'field "{key}" must be a list of integers')
    return values


def pack_documents(pack: object, origin: str) -> list[Conversation]:
    """The documents of one pack, each with its own ids and loss mask."""
    if not isinstance(pack, dict):
        raise RecordError(f"expected a dict with {', '.join(FIELDS)}, got {type(pack).__name__}")
    ids, mask, starts = (_int_array(pack, key) for key in FIELDS)
    if len(ids) == 0:
        raise RecordError('"input_ids" is empty')
    if len(mask) != len(ids):
        raise RecordError(f'"loss_mask" has {len(mask)} entries for {len(ids)} tokens')
    if not np.isin(mask, (0, 1)).all():
        raise RecordError('"loss_mask" must hold only 0 and 1')
    if len(starts) == 0 or starts[0] != 0:
        raise RecordError('"seq_start_id" must start with 0')
    if (np.diff(starts) <= 0).any() or starts[-1] >= len(ids):
        raise RecordError(f'"seq_start_id" must increase and stay below the pack length {len(ids)}')
    ends = [*starts[1:].tolist(), len(ids)]
    return [
        Conversation(
            [],
            f"{origin} document {index}",
            pretokenized=(ids[start:end].astype(np.int32), mask[start:end].astype(bool)),
        )
        for index, (start, end) in enumerate(zip(starts.tolist(), ends, strict=True))
    ]


def read_metadata(file: Path) -> dict[str, int]:
    """The packing metadata (a dict, or a list of dicts of which the largest values count)."""
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{file}: not a readable metadata JSON ({error})") from None
    entries = loaded if isinstance(loaded, list) else [loaded]
    if not entries or not all(isinstance(entry, dict) for entry in entries):
        raise DataError(f"{file}: expected an object (or a list of objects) of packing metadata")
    keys = ("pack_size", "max_samples_per_bin", "dataset_max_seqlen")
    return {
        key: max(int(entry[key]) for entry in entries if key in entry)
        for key in keys
        if any(key in entry for entry in entries)
    }


def check_against_metadata(
    packs: np.ndarray, metadata: dict[str, int], file: Path, metadata_file: Path
) -> None:
    for row, pack in enumerate(packs):
        if not isinstance(pack, dict):
            continue  # reported with the record
        length, documents = len(pack.get("input_ids", ())), len(pack.get("seq_start_id", ()))
        for key, value in (("pack_size", length), ("max_samples_per_bin", documents)):
            if key in metadata and value > metadata[key]:
                raise DataError(
                    f"{file} pack {row}: {value} {'tokens' if key == 'pack_size' else 'documents'}, "
                    f"but {metadata_file} says {key}={metadata[key]}: the metadata belongs to "
                    "other data"
                )


def iter_packed_documents(
    file: Path, metadata_file: Path | None = None
) -> Iterator[tuple[list[Conversation] | RecordError, str]]:
    """(documents of a pack, or what is wrong with it; origin) for every pack of `file`."""
    if file.suffix != ".npy":
        raise DataError(f"{file}: format mlperf reads packed .npy files")
    packs = load_packs(file)
    if metadata_file is not None:
        check_against_metadata(packs, read_metadata(metadata_file), file, metadata_file)
    for row, pack in enumerate(packs):
        origin = f"{file} pack {row}"
        try:
            yield pack_documents(pack, origin), origin
        except RecordError as error:
            yield error, origin
