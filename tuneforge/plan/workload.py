"""The work of one epoch from the dataset's real lengths: how the documents fall into
micro-batches (packed, or padded to the longest), the tokens computed and their FLOPs.

Without packing a micro-batch costs its longest document times its size, which is why halving
max_seq_len does not halve the time: the LUMI-G report measured 1.2x instead of 4x."""

from dataclasses import dataclass, field

from tuneforge.config.sections.data import DataSection
from tuneforge.data.bin_packing import STRATEGIES, padded_groups
from tuneforge.data.length_policy import RecordLengths
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
    micro_batch_lengths: list[list[int]] = field(default_factory=list)
    """Each micro-batch's rows as computed (a padded row at its padded width)."""


def documents_of(data: DataSection, records: RecordLengths) -> list[int]:
    """The lengths of the documents the loader deals: the data's length policy applied."""
    return records.documents(data.max_seq_len, data.on_too_long, data.split_long)


def mean_document_length(data: DataSection, records: RecordLengths | None) -> float:
    """The mean length of the documents the loader deals; `data.max_seq_len` without the
    records' lengths."""
    if records is None or not records.lengths:
        return float(data.max_seq_len)
    lengths = documents_of(data, records)
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
        [[width for width, count in group for _ in range(count)] for group in rows],
    )
