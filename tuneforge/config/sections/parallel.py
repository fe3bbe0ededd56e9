"""`parallel:` devices and sharding."""

from typing import Literal

from pydantic import Field

from tuneforge.config.sections.base import Section


class ParallelSection(Section):
    strategy: Literal["auto", "single", "ddp", "fsdp"] = "auto"
    """How to spread the run across devices; `auto` is `single` on one process and, on several,
    `ddp` where every GPU can hold the whole model (its predicted peak within 85% of the GPU; only
    gradients cross between GPUs), else `fsdp`."""
    tensor_parallel: int = Field(1, ge=1)
    """Ranks that split each attention and MLP layer (Megatron's column- and row-parallel
    projections, LoRA adapters split with their bases); they read the same data. Keep it within a
    node: every layer exchanges activations between them."""
    expert_parallel: int = Field(1, ge=1)
    """Ranks that split a mixture-of-experts layer's experts between them, sending each token to
    the rank holding its expert (all-to-all); a share of the data-parallel ranks, each still
    reading its own data (4 ranks with expert_parallel 2 are 4 data-parallel ranks)."""
    data_parallel_replicate: int = Field(1, ge=1)
    """Replica groups of HSDP: FSDP2 shards the model within each group (one per node, say) and
    the groups keep whole copies, averaging gradients between them; 1 shards over every
    data-parallel rank."""
    zero_stage: Literal[2, 3] | None = None
    """FSDP sharding: 2 keeps parameters gathered after forward (ZeRO-2), 3 reshards them (ZeRO-3).
    """
    reshard_after_forward: bool | None = None
    """FSDP2's name for the same choice: False is ZeRO-2, True is ZeRO-3."""
    reduce_dtype: Literal["float32", "model"] = "float32"
    """FSDP2 gradient reduction: in float32 (exact sums of bf16 gradients) or in the model's dtype
    (half the traffic)."""
    nccl_max_channels: int | None = Field(None, ge=1)
    """NCCL's channels per collective (sets NCCL_MAX_NCHANNELS before the process group starts;
    null: NCCL's own choice). Each channel's kernel takes an SM from the compute it overlaps; over
    NVLink a few channels still move a block's weights in well under a millisecond
    (docs/training.md)."""
