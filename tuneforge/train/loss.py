"""Cross-entropy over supervised tokens, in chunks, never holding all fp32 logits at once.

Training uses `LinearCrossEntropy`: each chunk's logits are made, turned into their gradient
(softmax minus one-hot) in place, and multiplied back into the hidden states' and the output
layer's gradients during the forward pass itself, so backward only scales them — no logits are
recomputed and at most one chunk's fp32 logits exist. `checkpointed_cross_entropy` (each
chunk's loss recomputed in backward by autograd) is the reference path it is tested against.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tuneforge.data.packing import IGNORE_INDEX


class LinearCrossEntropy(torch.autograd.Function):
    """Sum over rows of cross-entropy(hidden · weightᵀ, labels); no ignored labels here."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size: int):
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows, targets = hidden[start : start + chunk_size], labels[start : start + chunk_size]
            logits = (rows @ weight.t()).float()
            target_logits = logits.gather(1, targets[:, None]).squeeze(1)
            # d(loss)/d(logits) = softmax - one_hot, made in place (no second fp32 buffer)
            row_max = logits.amax(dim=-1, keepdim=True)
            grad_logits = logits.sub_(row_max).exp_()
            sums = grad_logits.sum(dim=-1, keepdim=True)
            logsumexp = (row_max + sums.log()).squeeze(1)
            total += (logsumexp - target_logits).sum()
            grad_logits.div_(sums)
            grad_logits.scatter_add_(
                1, targets[:, None], grad_logits.new_full((len(rows), 1), -1.0)
            )
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_hidden is not None:
                torch.matmul(grad_logits, weight, out=grad_hidden[start : start + chunk_size])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), rows)
            # before the next chunk's logits exist: two chunks of fp32 logits would be the peak
            del logits, grad_logits
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_total.float()
        return (
            grad_hidden * scale.to(grad_hidden.dtype) if grad_hidden is not None else None,
            grad_weight * scale.to(grad_weight.dtype) if grad_weight is not None else None,
            None,
            None,
        )


def _chunk_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def checkpointed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int,
    recompute: bool = True,
) -> torch.Tensor:
    """Chunk by chunk; with `recompute`, each chunk's logits are made again in backward."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, labels.numel(), chunk_size):
        chunk = (hidden[start : start + chunk_size], weight, labels[start : start + chunk_size])
        if recompute:
            total = total + checkpoint(_chunk_loss_sum, *chunk, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(*chunk)
    return total


def chunked_cross_entropy(
    hidden_TD: torch.Tensor,
    weight_VD: torch.Tensor,
    labels_T: torch.Tensor,
    chunk_size: int = 1024,
    fused: bool = True,
) -> tuple[torch.Tensor, int]:
    """Sum of token losses and the number of supervised tokens.

    Only rows with a label are projected to the vocabulary; the peak is one chunk of logits.
    """
    keep = (labels_T != IGNORE_INDEX).nonzero().squeeze(-1)
    hidden, labels = hidden_TD.index_select(0, keep), labels_T.index_select(0, keep)
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight_VD.requires_grad):
        total = checkpointed_cross_entropy(hidden, weight_VD, labels, chunk_size, recompute=False)
        return total, labels.numel()
    if fused:
        return LinearCrossEntropy.apply(hidden, weight_VD, labels, chunk_size), labels.numel()
    return checkpointed_cross_entropy(hidden, weight_VD, labels, chunk_size), labels.numel()
