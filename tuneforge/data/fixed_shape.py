"""A packed micro-batch brought to a fixed shape: exactly `tokens` tokens in `documents` document
slots, so that every step has the same tensor shapes and kernel arguments (what a captured CUDA
graph replays). Missing tokens become one last document of padding without labels (and out of
the MoE load-balancing loss: `real_tokens`); unused slots
are empty documents at the end of `cu_seqlens`; `max_seqlen` becomes `tokens`, a bound that
holds for every batch."""

import torch

from tuneforge.data.packing import PAD_TOKEN, PackedBatch
from tuneforge.data.token_store import IGNORE_INDEX
from tuneforge.packed import PackedSequences


def documents_needed(batch: PackedBatch, tokens: int) -> int:
    """Document slots `batch` takes at `tokens` tokens (one more when it needs padding)."""
    return batch.num_documents + (batch.tokens.numel() < tokens)


def to_fixed_shape(batch: PackedBatch, tokens: int, documents: int) -> PackedBatch:
    count = batch.tokens.numel()
    if count > tokens or documents_needed(batch, tokens) > documents:
        raise ValueError(
            f"a batch of {count} tokens in {batch.num_documents} documents does not fit "
            f"{tokens} tokens in {documents} documents"
        )
    ids, labels = batch.tokens, batch.labels
    cu_seqlens, positions = batch.packed.cu_seqlens, batch.packed.position_ids
    padding = tokens - count
    if padding:
        ids = torch.cat([ids, ids.new_full((padding,), PAD_TOKEN)])
        labels = torch.cat([labels, labels.new_full((padding,), IGNORE_INDEX)])
        positions = torch.cat([positions, torch.arange(padding, dtype=positions.dtype)])
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([tokens])])
    empty = documents + 1 - cu_seqlens.numel()
    cu_seqlens = torch.cat([cu_seqlens, cu_seqlens[-1:].expand(empty)])
    return PackedBatch(
        ids,
        labels,
        PackedSequences(cu_seqlens, tokens, positions),
        batch.num_loss_tokens,
        batch.num_padding + padding,
        torch.tensor(count),
        record_fields=batch.record_fields,
        row_lengths=batch.row_lengths,
    )
