"""What `data.max_seq_len` does to a record — kept, truncated, split into pieces or dropped —
and which of the resulting documents carry loss: the one rule the data pipeline applies and the
planner predicts with."""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Span = tuple[int, int]


def pieces(length: int, max_seq_len: int, on_too_long: str, split_long: bool) -> list[Span]:
    """[start, end) of the documents a record of `length` tokens becomes; none where it is
    dropped (`on_too_long: drop`, or `error`, which the data pipeline raises)."""
    if length <= max_seq_len:
        return [(0, length)]
    if split_long:
        return [
            (start, min(start + max_seq_len, length)) for start in range(0, length, max_seq_len)
        ]
    if on_too_long == "truncate":
        return [(0, max_seq_len)]
    return []


def target_spans(loss_mask: "Sequence[bool] | np.ndarray") -> tuple[int, ...]:
    """The label positions that carry loss, as flattened [start, end) runs: position t is
    supervised where token t + 1 is a target (`token_store.make_example`)."""
    supervised = np.asarray(loss_mask, dtype=np.int8)[1:]
    edges = np.flatnonzero(np.diff(np.concatenate(([0], supervised, [0]))))
    return tuple(int(edge) for edge in edges)


def count_targets(piece: Span, spans: tuple[int, ...], truncated: bool) -> int:
    """The supervised labels a piece keeps; a truncated record's last position loses its label
    (the token it predicts is cut off), while a split piece keeps it."""
    start, end = piece
    last = end - 1 if truncated else end
    return sum(
        max(0, min(spans[i + 1], last) - max(spans[i], start)) for i in range(0, len(spans), 2)
    )


def has_targets(piece: Span, spans: tuple[int, ...], truncated: bool) -> bool:
    return count_targets(piece, spans, truncated) > 0


@dataclass(frozen=True)
class RecordLengths:
    """Each record's tokenised length and where its supervised labels are: all the length policy
    needs, kept with the data's statistics for the planner."""

    lengths: list[int]
    spans: list[tuple[int, ...]] | None = field(default=None)
    """Per record, `target_spans`; None: every document is taken to carry loss."""

    def documents(self, max_seq_len: int, on_too_long: str, split_long: bool) -> list[int]:
        """The lengths of the documents the loader deals once the policy is applied."""
        kept = []
        for index, length in enumerate(self.lengths):
            truncated = length > max_seq_len and not split_long
            for piece in pieces(length, max_seq_len, on_too_long, split_long):
                if self.spans is None or has_targets(piece, self.spans[index], truncated):
                    kept.append(piece[1] - piece[0])
        return kept
