"""Bin packing of document lengths into micro-batches of at most `budget` tokens.

Both strategies sort by length (longest first, ties by index) and are deterministic:
- first-fit decreasing: each document goes to the first bin with room, found with a segment
  tree over the bins' free space (O(n log n));
- best-fit decreasing: each document goes to the fullest bin with room, found with a Fenwick
  tree over free-space values (O(n log budget)).

Without packing (`padded_groups`), documents are taken in a seeded random order and a micro-batch
closes when one more document would make `documents x longest` exceed the budget.
"""

import random


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    order = _decreasing(lengths, budget)
    size = 1
    while size < max(len(order), 1):
        size *= 2
    free = [budget] * (2 * size)  # leaves: bins (unopened ones are empty); nodes: max of children
    bins: list[list[int]] = []
    for index in order:
        length = lengths[index]
        node = 1
        while node < size:  # descend to the leftmost leaf with room
            node = 2 * node if free[2 * node] >= length else 2 * node + 1
        slot = node - size
        if slot == len(bins):
            bins.append([])
        bins[slot].append(index)
        free[node] -= length
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def best_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    order = _decreasing(lengths, budget)
    counts = [0] * (budget + 1)  # Fenwick tree over free space 1..budget: bins with that much room
    by_free: dict[int, list[int]] = {}
    bins: list[list[int]] = []

    def add(free: int, delta: int) -> None:
        while free <= budget:
            counts[free] += delta
            free += free & -free

    def prefix(free: int) -> int:
        total = 0
        while free > 0:
            total += counts[free]
            free -= free & -free
        return total

    def smallest_at_least(length: int) -> int | None:
        target = prefix(length - 1) + 1  # the target-th bin in order of free space
        if target > prefix(budget):
            return None
        position, step = 0, 1 << budget.bit_length()
        while step:
            if position + step <= budget and counts[position + step] < target:
                position += step
                target -= counts[position]
            step >>= 1
        return position + 1

    for index in order:
        length = lengths[index]
        free = smallest_at_least(length)
        if free is None:
            slot, free = len(bins), budget
            bins.append([])
        else:
            slot = by_free[free].pop()
            add(free, -1)
        bins[slot].append(index)
        remaining = free - length
        if remaining > 0:
            by_free.setdefault(remaining, []).append(slot)
            add(remaining, 1)
    return bins


def _decreasing(lengths: list[int], budget: int) -> list[int]:
    for index, length in enumerate(lengths):
        if length > budget:
            raise ValueError(
                f"example {index} has {length} tokens, more than the budget of {budget}"
            )
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def padded_groups(lengths: list[int], budget: int, seed: int) -> list[list[int]]:
    order = _decreasing(lengths, budget)
    random.Random(seed).shuffle(order)
    groups: list[list[int]] = []
    longest = 0
    for index in order:
        candidate = max(longest, lengths[index])
        if groups and candidate * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(index)
            longest = candidate
        else:
            groups.append([index])
            longest = lengths[index]
    return groups


STRATEGIES = {"ffd": first_fit_decreasing, "bfd": best_fit_decreasing}
