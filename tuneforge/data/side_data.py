"""Values a frozen model computed for every document before training, carried with each batch
of those documents (`PackedBatch.extras`): one value per document (a precomputed reference's
log-probability of the document's reply), or rows of values per supervised token (a cached
teacher's top-k logits and token ids), in the order the batch holds its supervised tokens."""

from typing import Protocol

import numpy as np
import torch


class SideData(Protocol):
    def gather(self, indexes: list[int]) -> dict[str, torch.Tensor]:
        """The values of the documents `indexes` (store indexes), in that order."""
        ...


class DocumentValues:
    """`values[name]` [documents]: one number per document of the store."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values

    def gather(self, indexes: list[int]) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(array[indexes]) for name, array in self.values.items()}


class TokenRows:
    """`rows[name]` [supervised tokens, k], document after document; `offsets` [documents + 1]
    gives each document's first row (its supervised tokens in order)."""

    def __init__(self, rows: dict[str, np.ndarray], offsets: np.ndarray) -> None:
        self.rows = rows
        self.offsets = offsets

    def gather(self, indexes: list[int]) -> dict[str, torch.Tensor]:
        spans = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indexes]
        return {
            name: torch.from_numpy(np.concatenate([array[a:b] for a, b in spans]))
            for name, array in self.rows.items()
        }


def supervised_offsets(loss_mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each document's first row among the store's supervised tokens: a document of n tokens
    has a target at token t < n - 1 where `loss_mask[t + 1]` (`TokenStore.arrays`)."""
    targets = np.zeros(len(loss_mask), dtype=np.int64)
    targets[:-1] = loss_mask[1:]
    targets[offsets[1:] - 1] = 0  # no target crosses into the next document
    counts = np.add.reduceat(targets, offsets[:-1]) if len(offsets) > 1 else np.zeros(0)
    counts[offsets[1:] == offsets[:-1]] = 0  # reduceat of an empty document reads the next one
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
