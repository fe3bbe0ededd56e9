"""Files others on a shared cluster can read: what tuneforge writes follows the umask, as any
file a program creates does. safetensors writes its files (and `tempfile` its directories)
readable by their owner only."""

import os
from collections.abc import Mapping
from pathlib import Path

import torch


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` the mode a plain `open` or `mkdir` would have given it."""
    base = 0o777 if path.is_dir() else 0o666
    path.chmod(base & ~current_umask())


def save_tensors(
    tensors: Mapping[str, torch.Tensor], file: Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file`, the file's mode following the umask."""
    from safetensors.torch import save_file

    save_file(dict(tensors), str(file), metadata=metadata)
    follow_umask(file)
