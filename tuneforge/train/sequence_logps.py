"""Log-probabilities of whole replies from a packed batch: each supervised token's log-probability
under the model (its logits made a chunk at a time, recomputed in backward, so at most one
chunk's fp32 logits exist), summed per document of the pack."""

import torch
from torch.utils.checkpoint import checkpoint

from tuneforge.data.packing import IGNORE_INDEX


def _chunk_logps(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
):
    logits = (hidden @ weight.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    supervised = labels != IGNORE_INDEX
    target = logits.gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
    return (target - torch.logsumexp(logits, dim=-1)) * supervised


def token_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int = 1024,
    temperature: float = 1.0,
) -> torch.Tensor:
    """[N] fp32: log p(label) of each row of `hidden` [N, D] under the output layer `weight`
    [V, D], its logits divided by `temperature` (the distribution a sampler at that temperature
    draws from); 0 where the label is IGNORE_INDEX. Differentiable in `hidden` and `weight`."""
    pieces = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            piece = checkpoint(
                _chunk_logps, hidden[rows], weight, labels[rows], temperature, use_reentrant=False
            )
        else:
            piece = _chunk_logps(hidden[rows], weight, labels[rows], temperature)
        pieces.append(piece)
    return torch.cat(pieces)


def document_sums(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[documents]: `values` [N] summed over each document's rows, the documents' boundaries
    `cu_seqlens` [documents + 1] (rows past the last boundary, padding, are left out)."""
    documents = cu_seqlens.numel() - 1
    rows = torch.arange(values.shape[0], device=values.device, dtype=cu_seqlens.dtype)
    document = torch.searchsorted(cu_seqlens[1:], rows, right=True)
    inside = document < documents
    sums = values.new_zeros(documents)
    return sums.index_add(0, document[inside], values[inside])
