"""How a run's ranks divide the work: one value that the planner, the trainer and the benchmark
share (as torchtitan's `ParallelDims`). Today the data-parallel ranks either replicate the model
(DDP) or shard it (FSDP2); tensor and expert dimensions are sizes of 1 until they are built."""

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

    def __post_init__(self) -> None:
        assert self.tensor == 1 and self.expert == 1, "tensor and expert parallelism: not built"
        assert self.data_parallel != "none" or self.world_size == 1, self

    @classmethod
    def of(cls, strategy: str, world_size: int) -> "ParallelDims":
        """From `parallel.strategy`'s name (`single`, `ddp`, `fsdp`) on `world_size` ranks."""
        return cls(STRATEGY_NAMES[strategy], world_size)

    @property
    def strategy(self) -> str:
        """The `parallel.strategy` name of the layout, as logs and plans show it."""
        return {kind: name for name, kind in STRATEGY_NAMES.items()}[self.data_parallel]

    @property
    def sharded(self) -> bool:
        """The model's blocks are sharded across the data-parallel ranks (FSDP2)."""
        return self.data_parallel == "shard"

    @property
    def replicated(self) -> bool:
        """Each rank holds the whole model inside a DDP wrapper."""
        return self.data_parallel == "replicate"

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tensor * self.expert)

    @property
    def dp_shard(self) -> int:
        return self.data_parallel_size if self.sharded else 1

    @property
    def dp_replicate(self) -> int:
        return self.data_parallel_size if self.replicated else 1
