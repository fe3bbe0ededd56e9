"""Micro-batches of tokenised documents: packed into a flat stream of at most `budget` tokens, or
padded to the longest document (`strategy="none"`, what training without packing looks like).

Labels are shifted inside each document before batching, so no target ever crosses a boundary.
"""

import random
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from tuneforge.data.bin_packing import STRATEGIES, padded_groups
from tuneforge.data.pairs import pair_bins
from tuneforge.data.rank_balance import attention_cost, balanced_deal
from tuneforge.data.records import DataError
from tuneforge.data.side_data import SideData
from tuneforge.data.token_store import IGNORE_INDEX, Example, TokenStore, make_example
from tuneforge.packed import PackedSequences, to_device

__all__ = ["IGNORE_INDEX", "Example", "PackedBatch", "PackedLoader", "collate", "make_example"]

PAD_TOKEN = 0
"""Padding positions hold this id; they come after the real tokens of their row, so causal
attention never lets a real token see them, and they carry no loss."""


@dataclass
class PackedBatch:
    tokens: torch.Tensor
    """int64 [T]: the documents (or padded rows) one after another."""
    labels: torch.Tensor
    """int64 [T]: next-token targets or IGNORE_INDEX."""
    packed: PackedSequences
    num_loss_tokens: int
    num_padding: int = 0
    """Padding tokens in `tokens` (0 when packed)."""
    real_tokens: torch.Tensor | None = None
    """With a fixed shape (`data.fixed_shape`): the tokens before the padding at the end, as a
    0-d tensor that the device reads (the MoE load-balancing loss leaves the padding out)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """What a frozen model computed for these documents before training (`data/side_data.py`):
    a precomputed reference's log-probabilities, a cached teacher's top-k logits."""
    record_fields: list[dict[str, object]] | None = None
    """Each document's record fields, in order, where the store keeps them (for rewards)."""
    row_lengths: list[int] | None = None
    """Padded rows (`data.packing: none`): each document's length before its row's padding."""

    @property
    def num_real_tokens(self) -> int:
        return self.tokens.numel() - self.num_padding

    @property
    def num_documents(self) -> int:
        return self.packed.cu_seqlens.numel() - 1

    def to(
        self, device: torch.device | str, tokens_to: torch.device | str | None = None
    ) -> "PackedBatch":
        """The batch on `device`, its token ids on `tokens_to` if given (where the embedding is)."""
        return PackedBatch(
            to_device(self.tokens, device if tokens_to is None else tokens_to),
            to_device(self.labels, device),
            self.packed.to(device),
            self.num_loss_tokens,
            self.num_padding,
            None if self.real_tokens is None else to_device(self.real_tokens, device),
            {name: to_device(value, device) for name, value in self.extras.items()},
            self.record_fields,
            self.row_lengths,
        )


def collate(examples: "Sequence[Example] | TokenStore", padded: bool = False) -> PackedBatch:
    store = TokenStore.from_examples(examples)
    return collate_from(store, list(range(len(store))), padded)


def collate_from(store: TokenStore, indexes: list[int], padded: bool = False) -> PackedBatch:
    """One micro-batch of the documents `indexes`: packed, or each padded to the longest."""
    ids, labels = store.arrays(indexes)
    lengths = [store.lengths[i] for i in indexes]
    num_padding = 0
    row_lengths = None
    if padded:
        row_lengths = lengths
        width = max(lengths)
        rows_ids = np.full((len(lengths), width), PAD_TOKEN, dtype=np.int64)
        rows_labels = np.full((len(lengths), width), IGNORE_INDEX, dtype=np.int64)
        start = 0
        for row, length in enumerate(lengths):
            rows_ids[row, :length] = ids[start : start + length]
            rows_labels[row, :length] = labels[start : start + length]
            start += length
        ids, labels = rows_ids.reshape(-1), rows_labels.reshape(-1)
        num_padding = width * len(lengths) - sum(lengths)
        lengths = [width] * len(lengths)
    tokens, targets = torch.from_numpy(ids), torch.from_numpy(labels)
    num_loss_tokens = int((targets != IGNORE_INDEX).sum())
    return PackedBatch(
        tokens,
        targets,
        PackedSequences.from_lengths(lengths),
        num_loss_tokens,
        num_padding,
        row_lengths=row_lengths,
    )


def epoch_deal(
    num_bins: int, seed: int, epoch: int, world_size: int, costs: Sequence[int] = ()
) -> list[int]:
    """An epoch's micro-batches in the order they are dealt: rank r takes every `world_size`-th
    from r. The seeded shuffle's last `num_bins % world_size` are left out; with `costs` (each
    micro-batch's attention work) the rest are dealt by `rank_balance.balanced_deal`."""
    order = list(range(num_bins))
    rng = random.Random(seed * 1_000_003 + epoch)
    rng.shuffle(order)
    order = order[: num_bins // world_size * world_size]
    return balanced_deal(order, costs, world_size, rng) if costs else order


class PackedLoader:
    """Endless micro-batches: the bins, reshuffled every epoch with a seeded generator.

    Bins are made once: packed (`ffd`, `bfd`) or, with `none`, documents in a seeded order taken
    while the padded batch fits the budget. With several data-parallel ranks each takes every
    `world_size`-th bin of the epoch's order, so ranks never share a bin; the last
    `len(bins) % world_size` bins of an epoch's order are left out of that epoch so that every rank
    runs the same number of steps. With `balance`, each step's ranks get bins of similar
    attention work instead (`rank_balance.balanced_deal`). The next `prefetch` micro-batches are
    built in a background thread; the state (epoch, position, seed) counts the micro-batches
    handed out, so it resumes the exact sequence.
    """

    def __init__(
        self,
        examples: "Sequence[Example] | TokenStore",
        budget: int,
        seed: int,
        strategy: str = "ffd",
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
        balance: bool = False,
        pairs: bool = False,
    ) -> None:
        """`pairs`: documents 2p and 2p + 1 are a preference pair, packed whole
        (`data/pairs.py`)."""
        self.store = TokenStore.from_examples(examples)
        lengths = self.store.lengths
        self.padded = strategy == "none"
        if pairs:
            self.bins = pair_bins(lengths, budget, strategy)
        elif self.padded:
            self.bins = padded_groups(lengths, budget, seed)
        else:
            self.bins = STRATEGIES[strategy](lengths, budget)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self.balance = balance and world_size > 1  # on one rank there is nothing to balance
        self.costs = (
            [attention_cost([lengths[i] for i in bin_]) for bin_ in self.bins]
            if self.balance
            else []
        )
        self.epoch = 0
        self.position = 0
        self.side_data: SideData | None = None
        """Values of each document computed before training, carried with its batches."""
        if len(self.bins) < world_size:
            raise DataError(
                f"{len(self.bins)} micro-batches cannot feed {world_size} ranks: "
                "use more data, or fewer data.tokens_per_micro_batch"
            )

    def __len__(self) -> int:
        """Micro-batches per epoch for this rank."""
        return len(self.bins) // self.world_size

    def epoch_order(self, epoch: int) -> list[int]:
        dealt = epoch_deal(len(self.bins), self.seed, epoch, self.world_size, self.costs)
        return dealt[self.rank :: self.world_size]

    def _schedule(self) -> Iterator[tuple[int, int, int]]:
        """(epoch, position after it, bin) from the current state on."""
        epoch, position = self.epoch, self.position
        while True:
            order = self.epoch_order(epoch)
            for index in range(position, len(order)):
                yield epoch, index + 1, order[index]
            epoch, position = epoch + 1, 0

    def batch(self, bin_index: int) -> PackedBatch:
        indexes = self.bins[bin_index]
        batch = collate_from(self.store, indexes, self.padded)
        if self.side_data is not None:
            batch.extras = self.side_data.gather(indexes)
        if self.store.fields is not None:
            batch.record_fields = [self.store.fields[i] for i in indexes]
        return batch

    def __iter__(self) -> Iterator[PackedBatch]:
        schedule = self._schedule()
        with ThreadPoolExecutor(1, thread_name_prefix="tuneforge-prefetch") as pool:
            pending: deque[tuple[int, int, Future[PackedBatch]]] = deque()

            def submit() -> None:
                epoch, position, bin_index = next(schedule)
                pending.append((epoch, position, pool.submit(self.batch, bin_index)))

            for _ in range(max(1, self.prefetch)):
                submit()
            while True:
                epoch, position, future = pending.popleft()
                submit()
                batch = future.result()
                self.epoch, self.position = epoch, position
                yield batch

    def state_dict(self) -> dict[str, int]:
        state = {"epoch": self.epoch, "position": self.position, "seed": self.seed}
        return state | {"balance": int(self.balance)}

    def load_state_dict(self, state: dict[str, int], saved_world_size: int | None = None) -> None:
        """`saved_world_size`: the ranks the state was saved on, where they differ from these;
        the same share of the epoch is taken, under the new split's own deal."""
        if saved_world_size not in (None, self.world_size):
            position = state["position"] * saved_world_size // self.world_size
            state = state | {"position": position, "balance": int(self.balance)}
        if state["seed"] != self.seed:
            raise DataError(
                f"loader state was saved with seed {state['seed']}, this loader has {self.seed}"
            )
        if bool(state.get("balance", 0)) != self.balance:  # saved before it existed: off
            saved = "on" if state.get("balance") else "off"
            raise DataError(
                f"the loader's state was saved with data.balance_ranks {saved}: the epoch's "
                "order differs with it; resume with the same setting"
            )
        self.epoch, self.position = state["epoch"], state["position"]

    def fixed_batches(self) -> list[PackedBatch]:
        """Every bin once, in packing order (for evaluation)."""
        return [self.batch(index) for index in range(len(self.bins))]
