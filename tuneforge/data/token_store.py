"""Tokenised documents in three flat arrays: token ids, loss mask and document offsets.

The arrays may be memory-mapped from the cache, so a store of millions of documents opens at
once and only the documents a micro-batch needs are read.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]
    """Next-token targets, IGNORE_INDEX where no loss is taken (always at the last token)."""
    fields: dict[str, object] | None = None
    """Its record's other fields, where the objective scores against them (`Conversation`)."""


def make_example(input_ids: list[int], loss_mask: list[bool]) -> Example:
    labels = [
        input_ids[t + 1] if loss_mask[t + 1] else IGNORE_INDEX for t in range(len(input_ids) - 1)
    ]
    return Example(input_ids, [*labels, IGNORE_INDEX])


class TokenStore:
    """Documents backed by `input_ids` (int32), `loss_mask` (bool: the token is a target) and
    `offsets` (int64, one more than documents); `fields`, where kept, holds each document's
    record fields."""

    def __init__(
        self,
        input_ids: np.ndarray,
        loss_mask: np.ndarray,
        offsets: np.ndarray,
        fields: list[dict[str, object]] | None = None,
    ) -> None:
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.offsets = offsets
        self.lengths = np.diff(offsets).tolist()
        self.fields = fields

    @classmethod
    def from_examples(cls, examples: "Sequence[Example] | TokenStore") -> "TokenStore":
        if isinstance(examples, TokenStore):
            return examples
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
        kept = any(example.fields is not None for example in examples)
        fields = [example.fields or {} for example in examples] if kept else None
        return cls(input_ids, mask, offsets, fields)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Example:
        ids, labels = self.arrays([index])
        fields = None if self.fields is None else self.fields[index]
        return Example(ids.tolist(), labels.tolist(), fields)

    def arrays(self, indexes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and next-token labels (int64) of the documents, one after another."""
        ids = np.concatenate(
            [self.input_ids[self.offsets[i] : self.offsets[i + 1]] for i in indexes]
        ).astype(np.int64)
        mask = np.concatenate(
            [self.loss_mask[self.offsets[i] : self.offsets[i + 1]] for i in indexes]
        )
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        labels[:-1] = np.where(mask[1:], ids[1:], IGNORE_INDEX)
        ends = np.cumsum([self.lengths[i] for i in indexes]) - 1
        labels[ends] = IGNORE_INDEX  # no target crosses into the next document
        return ids, labels
