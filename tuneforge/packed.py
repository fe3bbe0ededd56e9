"""Sequences packed into one flat token stream, delimited by `cu_seqlens`."""

from dataclasses import dataclass

import torch


@dataclass
class PackedSequences:
    """Where each document starts and ends in a flat stream, and each token's position in its document."""

    cu_seqlens: torch.Tensor
    """int32 [num_docs + 1]: document boundaries, starting at 0."""
    max_seqlen: int
    position_ids: torch.Tensor
    """int64 [num_tokens]: position of each token within its own document."""

    @classmethod
    def from_lengths(
        cls, lengths: list[int], device: torch.device | str = "cpu"
    ) -> "PackedSequences":
        starts = [0]
        for length in lengths:
            starts.append(starts[-1] + length)
        positions = (
            torch.cat([torch.arange(length) for length in lengths]) if lengths else torch.zeros(0)
        )
        return cls(
            cu_seqlens=torch.tensor(starts, dtype=torch.int32, device=device),
            max_seqlen=max(lengths, default=0),
            position_ids=positions.to(device=device, dtype=torch.long),
        )

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> "PackedSequences":
        """Boundaries given; positions restart at 0 in each document unless given."""
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        if position_ids is None:
            position_ids = torch.cat([torch.arange(n, device=cu_seqlens.device) for n in lengths])
        return cls(
            cu_seqlens.to(torch.int32), max_seqlen or max(lengths, default=0), position_ids.long()
        )

    def lengths(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    def to(self, device: torch.device | str) -> "PackedSequences":
        return PackedSequences(
            to_device(self.cu_seqlens, device),
            self.max_seqlen,
            to_device(self.position_ids, device),
        )


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`; from host to GPU through pinned memory without blocking, so the host
    goes on queueing work instead of waiting for the copy (and for what the GPU runs before it)."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    pinned = tensor if tensor.is_pinned() else tensor.pin_memory()
    return pinned.to(device, non_blocking=True)
