"""Synthetic training batches: documents of log-normal lengths packed into exactly the step's
tokens (what a packed real dataset gives), or one document filling it (what the peers see)."""

import numpy as np
import torch

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.packed import PackedSequences

MEDIAN_DOC_TOKENS = 600
SIGMA = 0.9


def document_lengths(tokens: int, rng: np.random.Generator) -> list[int]:
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(np.clip(rng.lognormal(np.log(MEDIAN_DOC_TOKENS), SIGMA), 16, tokens)))
    lengths[-1] -= sum(lengths) - tokens  # the last document is cut to fill the step
    return [length for length in lengths if length > 0]


def synthetic_batch(vocab_size: int, tokens: int, one_document: bool, seed: int) -> PackedBatch:
    rng = np.random.default_rng(seed)
    lengths = [tokens] if one_document else document_lengths(tokens, rng)
    ids = rng.integers(0, vocab_size, tokens)
    labels = np.roll(ids, -1)
    labels[np.cumsum(lengths) - 1] = IGNORE_INDEX  # no target across a document's end
    return PackedBatch(
        torch.from_numpy(ids),
        torch.from_numpy(labels),
        PackedSequences.from_lengths(lengths),
        int((labels != IGNORE_INDEX).sum()),
    )
