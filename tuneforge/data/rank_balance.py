"""Dealing micro-batches to data-parallel ranks so that each step's ranks get similar attention
work. A step waits for its slowest rank, and a packed micro-batch's cost grows with the squares of
its documents' lengths (its tokens are fixed by the budget): one long document can make a
micro-batch a quarter slower than one of short documents. Within windows of
`WINDOW_STEPS` steps the micro-batches are sorted by that cost and dealt in neighbouring groups
of `world_size`, one group per step; the groups' order, and which rank gets which micro-batch of a
group, are shuffled. Sorting and grouping neighbours gives the least sum of the groups' largest
costs a window allows."""

import random
from collections.abc import Sequence

WINDOW_STEPS = 8


def attention_cost(lengths: Sequence[int]) -> int:
    """A micro-batch's attention work: the sum of its documents' squared lengths."""
    return sum(length * length for length in lengths)


def balanced_deal(
    order: Sequence[int], costs: Sequence[int], world_size: int, rng: random.Random
) -> list[int]:
    """`order` (micro-batch indexes, a multiple of `world_size` of them) dealt again so that
    rank r taking every `world_size`-th entry from r gets, step by step, micro-batches of
    similar cost to the other ranks'."""
    if len(order) % world_size:
        raise ValueError(f"{len(order)} micro-batches do not split over {world_size} ranks")
    window = world_size * WINDOW_STEPS
    dealt: list[int] = []
    for start in range(0, len(order), window):
        ranked = sorted(order[start : start + window], key=lambda index: costs[index])
        groups = [ranked[i : i + world_size] for i in range(0, len(ranked), world_size)]
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)  # no rank always holds the heaviest of its step
            dealt += group
    return dealt
