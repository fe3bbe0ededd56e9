"""Reading a `torch.distributed.checkpoint` without running code from it.

DCP pickles two things: the checkpoint's `.metadata` and every non-tensor value (the optimizer's
`param_groups`), and its stock reader unpickles both with all of Python at hand, so a crafted
file in a shared run directory would run its payload on `--resume`. Here the metadata goes
through an unpickler that admits DCP's own types and nothing else, and non-tensor values through
`torch.load(weights_only=True)`; a file that names anything else is refused.
"""

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from tuneforge.errors import TuneforgeError

METADATA_TYPES = frozenset(
    [("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")]
    + [("pathlib", "WindowsPath"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo")]
    + [
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ]
)
"""What DCP's `.metadata` holds besides plain values (dtypes come as `torch.<dtype>`)."""


class UnsafeCheckpointError(TuneforgeError):
    """A checkpoint file names code where only data belongs."""


class DamagedCheckpointError(TuneforgeError):
    """A checkpoint whose files cannot be read back."""

    def __init__(self, checkpoint: Path, problem: str) -> None:
        super().__init__(f"{checkpoint} is damaged ({problem})")
        self.checkpoint = checkpoint


class _Refused(pickle.UnpicklingError):
    """A global the metadata may not name (told apart from a file that is merely damaged)."""


def _refusal(file: Path, error: Exception) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{file}: refused: it is not data a checkpoint holds ({error}); it may have been crafted "
        "to run code. Resume only from run directories that you or your jobs wrote; remove this "
        "checkpoint (or resume from an earlier one with --resume checkpoints/step_N)"
    )


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or (module, name) in METADATA_TYPES:
            return super().find_class(module, name)
        raise _Refused(f"it names {module}.{name}")


def read_metadata_file(file: Path) -> Metadata:
    """A `.metadata` file's contents, refused unless made of DCP's own types."""
    try:
        with file.open("rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except _Refused as error:
        raise _refusal(file, error) from None
    except Exception as error:  # missing, cut short or garbled: any error of the pickle machinery
        raise DamagedCheckpointError(file.parent.parent, f"{file.name}: {error!r}") from None
    if not isinstance(metadata, Metadata):
        raise _refusal(file, TypeError(f"it holds a {type(metadata).__name__}"))
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file-system reader with the metadata read by `read_metadata_file` (or given, when
    the caller read it first to report a refused or damaged file before DCP starts)."""

    def __init__(self, path: Path, metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        given = self.metadata if rank is None else None
        metadata = given if given is not None else read_metadata_file(Path(self.path) / name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner with non-tensor values read by `torch.load(weights_only=True)`."""

    def __init__(self, checkpoint: Path) -> None:
        super().__init__()
        self.checkpoint = checkpoint

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            data = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:  # what torch raises for a global it does not admit
            named = [line for line in str(error).splitlines() if "global" in line.lower()]
            raise _refusal(self.checkpoint, ValueError((named or ["unpickling"])[0])) from None
        except Exception as error:  # cut short or garbled
            raise DamagedCheckpointError(self.checkpoint.parent, repr(error)) from None
        # the stock method unpickles without restriction: hand it these checked values anew
        checked = io.BytesIO()
        torch.save(data, checked)
        checked.seek(0)
        super().load_bytes(read_item, checked)
