"""The work of one epoch from the dataset's real lengths: how the documents fall into
micro-batches (packed, or padded to the longest), the tokens computed and their FLOPs.

Without packing a micro-batch costs its longest document times its size, which is why halving
max_seq_len does not halve the time: the LUMI-G report measured 1.2x instead of 4x."""

from dataclasses import dataclass, field

from tuneforge.config.schema import DataSection
from tuneforge.data.bin_packing import STRATEGIES, padded_groups
from tuneforge.data.rank_balance import attention_cost
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    LoraShape,
    attention_flops_per_token,
    forward_matmul_flops_per_token,
    lora_params,
)


@dataclass(frozen=True)
class Workload:
    micro_batches: int
    real_tokens: int
    computed_tokens: int
    """Real tokens plus padding."""
    flops: float
    """Training FLOPs of the epoch (forward and backward)."""
    mean_doc_len: float
    micro_batch_flops: list[float] = field(default_factory=list)
    """Each micro-batch's training FLOPs, in packing order."""
    micro_batch_attention: list[int] = field(default_factory=list)
    """Each micro-batch's attention work as the loader deals by it (`rank_balance`)."""


def lengths_after_policy(
    raw: list[int], max_seq_len: int, on_too_long: str, split_long: bool
) -> list[int]:
    """Document lengths the loader sees once the length policy is applied."""
    kept = []
    for length in raw:
        if length <= max_seq_len:
            kept.append(length)
        elif split_long:
            kept += [max_seq_len] * (length // max_seq_len)
            if length % max_seq_len:
                kept.append(length % max_seq_len)
        elif on_too_long == "truncate":
            kept.append(max_seq_len)
    return kept


def mean_document_length(data: DataSection, raw_lengths: list[int] | None) -> float:
    """The mean length of the documents the loader deals (the length policy applied to the
    records' tokenised lengths); `data.max_seq_len` without them."""
    if not raw_lengths:
        return float(data.max_seq_len)
    lengths = lengths_after_policy(raw_lengths, data.max_seq_len, data.on_too_long, data.split_long)
    return sum(lengths) / max(len(lengths), 1)


def epoch_workload(
    args: ModelArgs,
    lengths: list[int],
    budget: int,
    packing: str,
    lora: LoraShape | None,
    seed: int = 0,
) -> Workload:
    """FLOPs of one epoch: every row costs its matmuls per token and causal attention over its
    own length (a padded row attends over its padded width)."""
    if packing == "none":
        groups = padded_groups(lengths, budget, seed)  # as the loader groups them
        rows = [[(max(lengths[i] for i in group), len(group))] for group in groups]
    else:
        groups = STRATEGIES[packing](lengths, budget)
        rows = [[(lengths[i], 1) for i in group] for group in groups]
    matmul = forward_matmul_flops_per_token(args)
    adapters = 2 * lora_params(args, lora, active=True) if lora is not None else 0.0
    per_token = (2 * matmul + 3 * adapters) if lora is not None else 3 * matmul
    computed = sum(width * count for group in rows for width, count in group)
    group_flops = [
        sum(
            width * count * (per_token + 3 * attention_flops_per_token(args, width))
            for width, count in group
        )
        for group in rows
    ]
    real = sum(lengths)
    return Workload(
        len(groups),
        real,
        computed,
        sum(group_flops),
        real / max(len(lengths), 1),
        group_flops,
        [attention_cost([lengths[i] for i in group]) for group in groups],
    )
