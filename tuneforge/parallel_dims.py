"""How a run's ranks divide the work: one value that the planner, the trainer and the benchmark
share (as torchtitan's `ParallelDims`). The data-parallel ranks either replicate the model (DDP)
or shard it (FSDP2), in `replicate` groups that each keep a whole copy (HSDP); `tensor` ranks
split each layer and read the same data; `expert` ranks, a share of the data-parallel ones,
split each mixture-of-experts layer's experts.

Ranks are laid out with the tensor dimension innermost (a node's GPUs share its fast links), then
the expert dimension, then the FSDP2 shards outside it, then the replica groups:
rank = ((replica · expert_shards + expert_shard) · expert + expert_rank) · tensor + tensor_rank."""

from dataclasses import dataclass
from typing import Literal

DataParallel = Literal["none", "replicate", "shard"]

STRATEGY_NAMES: dict[str, DataParallel] = {"single": "none", "ddp": "replicate", "fsdp": "shard"}
"""`parallel.strategy`'s names for the data-parallel kinds."""


@dataclass(frozen=True)
class ParallelDims:
    data_parallel: DataParallel = "none"
    """How the data-parallel ranks hold the model: `replicate` (DDP: whole copies, gradients
    averaged), `shard` (FSDP2: 1/N of each block each, gathered for use) or `none` (one
    process, or a replica that is not wrapped)."""
    world_size: int = 1
    tensor: int = 1
    expert: int = 1
    replicate: int = 1
    """HSDP's replica groups (`parallel.data_parallel_replicate`) under FSDP2."""

    def __post_init__(self) -> None:
        assert self.data_parallel != "none" or self.world_size == 1, self
        assert self.world_size % (self.tensor * self.replicate) == 0, self
        assert self.data_parallel_size % (self.replicate * self.expert) == 0, self
        assert self.data_parallel == "shard" or not self.on_mesh, self

    @classmethod
    def of(
        cls, strategy: str, world_size: int, tensor: int = 1, expert: int = 1, replicate: int = 1
    ) -> "ParallelDims":
        """From `parallel.strategy`'s name (`single`, `ddp`, `fsdp`) on `world_size` ranks."""
        return cls(STRATEGY_NAMES[strategy], world_size, tensor, expert, replicate)

    @property
    def strategy(self) -> str:
        """The `parallel.strategy` name of the layout."""
        return {kind: name for name, kind in STRATEGY_NAMES.items()}[self.data_parallel]

    @property
    def on_mesh(self) -> bool:
        """A tensor, expert or replica dimension: the ranks form a device mesh of several
        dimensions, not one flat group."""
        return self.tensor > 1 or self.expert > 1 or self.replicate > 1

    def describe(self) -> str:
        """The layout as logs and plans show it: `fsdp`, or `hsdp 2×2 · tp 2 · ep 2`."""
        if not self.on_mesh:
            return self.strategy
        data = (
            f"hsdp {self.replicate}×{self.dp_shard}"
            if self.replicate > 1
            else f"fsdp {self.dp_shard}"
        )
        parts = [data]
        parts += [f"tp {self.tensor}"] if self.tensor > 1 else []
        parts += [f"ep {self.expert}"] if self.expert > 1 else []
        return " · ".join(parts)

    @property
    def sharded(self) -> bool:
        """The model's parameters are DTensors sharded across ranks (FSDP2, and any mesh)."""
        return self.data_parallel == "shard"

    @property
    def replicated(self) -> bool:
        """Each rank holds the whole model inside a DDP wrapper."""
        return self.data_parallel == "replicate"

    @property
    def data_parallel_size(self) -> int:
        """Ranks that read different data: all but the tensor-parallel copies."""
        return self.world_size // self.tensor

    @property
    def dp_shard(self) -> int:
        """Ranks that FSDP2 shards each parameter over (within one replica group)."""
        return self.data_parallel_size // self.replicate if self.sharded else 1

    @property
    def dp_replicate(self) -> int:
        """Whole copies of the model: HSDP's replica groups, or DDP's ranks."""
        return self.data_parallel_size if self.replicated else self.replicate

    @property
    def expert_shards(self) -> int:
        """Ranks that FSDP2 shards each expert-parallel rank's experts over."""
        return self.dp_shard // self.expert

    def data_rank(self, rank: int) -> int:
        """Which share of the data `rank` reads: the tensor-parallel ranks read the same."""
        return rank // self.tensor
