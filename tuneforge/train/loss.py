"""Cross-entropy over supervised tokens, in chunks, never holding all fp32 logits at once."""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tuneforge.data.packing import IGNORE_INDEX


def _chunk_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def chunked_cross_entropy(
    hidden_TD: torch.Tensor, weight_VD: torch.Tensor, labels_T: torch.Tensor, chunk_size: int = 1024
) -> tuple[torch.Tensor, int]:
    """Sum of token losses and the number of supervised tokens.

    Only rows with a label are projected to the vocabulary; each chunk's logits are
    recomputed in backward instead of being stored, so the peak is one chunk of logits.
    """
    keep = (labels_T != IGNORE_INDEX).nonzero().squeeze(-1)
    hidden, labels = hidden_TD.index_select(0, keep), labels_T.index_select(0, keep)
    total = hidden_TD.new_zeros((), dtype=torch.float32)
    for start in range(0, labels.numel(), chunk_size):
        end = start + chunk_size
        if torch.is_grad_enabled():
            part = checkpoint(
                _chunk_loss_sum,
                hidden[start:end],
                weight_VD,
                labels[start:end],
                use_reentrant=False,
            )
        else:
            part = _chunk_loss_sum(hidden[start:end], weight_VD, labels[start:end])
        total = total + part
    return total, labels.numel()
