"""Preference pairs as documents of a token store: pair p is documents 2p (the chosen reply's
conversation) and 2p + 1 (the rejected one's), and a micro-batch holds whole pairs, each pair's
two documents side by side, packed without padding."""

from tuneforge.data.bin_packing import STRATEGIES


def pair_bins(lengths: list[int], budget: int, strategy: str = "ffd") -> list[list[int]]:
    """Micro-batches of whole pairs: documents [2p, 2p + 1, 2q, 2q + 1, ...], at most `budget`
    tokens each, packed by the pairs' total lengths."""
    if len(lengths) % 2:
        raise ValueError(f"pairs come as two documents each; got {len(lengths)} documents")
    if strategy not in STRATEGIES:
        raise ValueError(f"pairs are packed with one of {sorted(STRATEGIES)}, not {strategy!r}")
    totals = [lengths[2 * pair] + lengths[2 * pair + 1] for pair in range(len(lengths) // 2)]
    return [
        [document for pair in sorted(bin_) for document in (2 * pair, 2 * pair + 1)]
        for bin_ in STRATEGIES[strategy](totals, budget)
    ]
