"""Batches of sampled completions kept for GRPO's further iterations (`num_iterations`): trained
on again without sampling, and written with each checkpoint as JSON values (floats in full, so
that a resume reads the same bits)."""

import itertools
from typing import Any

import torch

from tuneforge.data.packing import PackedBatch
from tuneforge.packed import PackedSequences


def again(batch: PackedBatch) -> PackedBatch:
    """A kept batch trained on again: nothing was sampled for it this time."""
    extras = dict(batch.extras)
    extras["generation_s"] = torch.zeros_like(extras["generation_s"])
    extras["generated_tokens"] = torch.zeros_like(extras["generated_tokens"])
    if "sampling_rounds" in extras:
        extras["sampling_rounds"] = torch.zeros_like(extras["sampling_rounds"])
    return PackedBatch(
        batch.tokens, batch.labels, batch.packed, batch.num_loss_tokens, batch.num_padding,
        batch.real_tokens, extras,
    )  # fmt: skip


def batch_state(batch: PackedBatch) -> dict[str, Any]:
    """A sampled batch as JSON values (floats written in full: a resume reads the same bits)."""
    return {
        "tokens": batch.tokens.tolist(),
        "labels": batch.labels.tolist(),
        "cu_seqlens": batch.packed.cu_seqlens.tolist(),
        "num_loss_tokens": batch.num_loss_tokens,
        "extras": {
            name: {"shape": list(value.shape), "values": value.double().flatten().tolist()}
            for name, value in batch.extras.items()
        },
    }


def batch_of_state(state: dict[str, Any], device: torch.device) -> PackedBatch:
    lengths = [b - a for a, b in itertools.pairwise(state["cu_seqlens"])]
    extras = {
        name: torch.tensor(value["values"], dtype=torch.float32, device=device).reshape(
            value["shape"]
        )
        for name, value in state["extras"].items()
    }
    return PackedBatch(
        torch.tensor(state["tokens"], dtype=torch.long, device=device),
        torch.tensor(state["labels"], dtype=torch.long, device=device),
        PackedSequences.from_lengths(lengths, device),
        state["num_loss_tokens"],
        extras=extras,
    )
