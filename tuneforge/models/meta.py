"""Modules built on the meta device without their own random initialisation."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

INITIALISED = (nn.Linear, nn.Embedding)


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules with shapes and no storage, for weights loaded or initialised next. Their
    `reset_parameters` is skipped: on the meta device it does nothing but cost time (the first
    random fill there imports torch's compiler, a second or more)."""
    saved = {cls: cls.reset_parameters for cls in INITIALISED}
    try:
        for cls in INITIALISED:
            cls.reset_parameters = _skipped  # type: ignore[method-assign]
        with torch.device("meta"):
            yield
    finally:
        for cls, method in saved.items():
            cls.reset_parameters = method  # type: ignore[method-assign]


def _skipped(self: nn.Module) -> None:
    return None
