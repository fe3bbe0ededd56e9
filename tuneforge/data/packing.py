"""Pack tokenised documents into flat micro-batches of at most `budget` tokens.

Labels are shifted inside each document before packing, so no target ever crosses a boundary.
"""

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from tuneforge.data.bin_packing import STRATEGIES
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


class PackedLoader:
    """Endless micro-batches: the packed bins, reshuffled every epoch with a seeded generator.

    With several data-parallel ranks each takes every `world_size`-th bin of the epoch's order,
    so ranks never share a bin; the last `len(bins) % world_size` bins of an epoch's order are
    left out of that epoch so that every rank runs the same number of steps. The state (epoch,
    position) resumes the exact sequence.
    """

    def __init__(
        self,
        examples: "Sequence[Example]",
        budget: int,
        seed: int,
        strategy: str = "ffd",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.examples = examples
        lengths = getattr(examples, "lengths", None) or [len(ex.input_ids) for ex in examples]
        self.bins = STRATEGIES[strategy](lengths, budget)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        if len(self.bins) < world_size:
            raise ValueError(f"{len(self.bins)} micro-batches cannot feed {world_size} ranks")

    def __len__(self) -> int:
        """Micro-batches per epoch for this rank."""
        return len(self.bins) // self.world_size

    def epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.bins)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order[self.rank : len(self) * self.world_size : self.world_size]

    def __iter__(self) -> Iterator[PackedBatch]:
        while True:
            order = self.epoch_order(self.epoch)
            while self.position < len(order):
                bin_indexes = self.bins[order[self.position]]
                self.position += 1
                yield collate([self.examples[i] for i in bin_indexes])
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(
                f"loader state was saved with seed {state['seed']}, this loader has {self.seed}"
            )
        self.epoch, self.position = state["epoch"], state["position"]

    def fixed_batches(self) -> list[PackedBatch]:
        """Every bin once, in packing order (for evaluation)."""
        return [collate([self.examples[i] for i in bin_indexes]) for bin_indexes in self.bins]
