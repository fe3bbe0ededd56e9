"""Pack tokenised documents into flat micro-batches of at most `budget` tokens.

Labels are shifted inside each document before packing, so no target ever crosses a boundary.
"""

import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tuneforge.models.packed import PackedSequences

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]
    """Next-token targets, IGNORE_INDEX where no loss is taken (always at the last token)."""


def make_example(input_ids: list[int], loss_mask: list[bool]) -> Example:
    labels = [
        input_ids[t + 1] if loss_mask[t + 1] else IGNORE_INDEX for t in range(len(input_ids) - 1)
    ]
    return Example(input_ids, [*labels, IGNORE_INDEX])


@dataclass
class PackedBatch:
    tokens: torch.Tensor
    """int64 [T]: the documents one after another."""
    labels: torch.Tensor
    """int64 [T]: next-token targets or IGNORE_INDEX."""
    packed: PackedSequences
    num_loss_tokens: int

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(
            self.tokens.to(device),
            self.labels.to(device),
            self.packed.to(device),
            self.num_loss_tokens,
        )


def collate(examples: list[Example]) -> PackedBatch:
    tokens = torch.tensor([t for ex in examples for t in ex.input_ids], dtype=torch.long)
    labels = torch.tensor([t for ex in examples for t in ex.labels], dtype=torch.long)
    packed = PackedSequences.from_lengths([len(ex.input_ids) for ex in examples])
    return PackedBatch(tokens, labels, packed, int((labels != IGNORE_INDEX).sum()))


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Bins of example indexes whose lengths sum to at most `budget`; deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for index in order:
        length = lengths[index]
        if length > budget:
            raise ValueError(
                f"example {index} has {length} tokens, more than the budget of {budget}"
            )
        for slot, free in enumerate(room):
            if length <= free:
                bins[slot].append(index)
                room[slot] -= length
                break
        else:
            bins.append([index])
            room.append(budget - length)
    return bins


class PackedLoader:
    """Endless micro-batches: the packed bins, reshuffled every epoch with a seeded generator."""

    def __init__(self, examples: list[Example], budget: int, seed: int) -> None:
        self.examples = examples
        self.bins = first_fit_decreasing([len(ex.input_ids) for ex in examples], budget)
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return len(self.bins)

    def epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.bins)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator[PackedBatch]:
        while True:
            order = self.epoch_order(self.epoch)
            while self.position < len(order):
                bin_indexes = self.bins[order[self.position]]
                self.position += 1
                yield collate([self.examples[i] for i in bin_indexes])
            self.epoch += 1
            self.position = 0

    def fixed_batches(self) -> list[PackedBatch]:
        """Every bin once, in packing order (for evaluation)."""
        return [collate([self.examples[i] for i in bin_indexes]) for bin_indexes in self.bins]
