"""Cross-entropy over supervised tokens, in chunks, never holding all fp32 logits at once.

Training uses `LinearCrossEntropy`: each chunk's logits are made, turned into their gradient
(softmax minus one-hot) in place, and multiplied back into the hidden states' and the output
layer's gradients during the forward pass itself, so backward only scales them — no logits are
recomputed and at most one chunk's fp32 logits exist. With `compiled`, the step from a chunk's
bf16 logits to their loss and bf16 gradient is one compiled function (two fused passes over
the logits, no fp32 copy of them). `checkpointed_cross_entropy` (each chunk's loss recomputed in backward by autograd) is
the reference path both are tested against.

Normally only the supervised rows are projected. With `every_row`, all rows are, the ignored
ones weighted 0: the shapes then do not depend on the labels, as a captured CUDA graph needs.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tuneforge.data.packing import IGNORE_INDEX


def _loss_and_grad_logits_in_place(
    logits: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the rows' cross-entropy, d(sum)/d(logits) in `dtype`); one fp32 buffer. Rows
    whose target is IGNORE_INDEX count 0 and get a zero gradient."""
    supervised = (targets != IGNORE_INDEX).float()[:, None]
    targets = targets.clamp(min=0)
    logits = logits.float()
    target_logits = logits.gather(1, targets[:, None]).squeeze(1)
    # d(loss)/d(logits) = softmax - one_hot, made in place (no second fp32 buffer); the ignored
    # rows' zeros come with the softmax's normalisation (no extra pass over the logits)
    row_max = logits.amax(dim=-1, keepdim=True)
    grad_logits = logits.sub_(row_max).exp_()
    sums = grad_logits.sum(dim=-1, keepdim=True)
    logsumexp = (row_max + sums.log()).squeeze(1)
    grad_logits.mul_(supervised / sums)
    grad_logits.scatter_add_(1, targets[:, None], -supervised)
    return ((logsumexp - target_logits) * supervised.squeeze(1)).sum(), grad_logits.to(dtype)


def _loss_and_grad_logits(
    logits: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as a plain expression, for torch.compile to fuse (fp32 only in registers)."""
    supervised = (targets != IGNORE_INDEX).float()
    targets = targets.clamp(min=0)
    logits = logits.float()
    logsumexp = torch.logsumexp(logits, dim=-1)
    target_logits = logits.gather(1, targets[:, None]).squeeze(1)
    columns = torch.arange(logits.shape[1], device=logits.device)
    one_hot = (columns[None, :] == targets[:, None]).float()
    grad_logits = (torch.exp(logits - logsumexp[:, None]) - one_hot) * supervised[:, None]
    return ((logsumexp - target_logits) * supervised).sum(), grad_logits.to(dtype)


_compiled_loss_and_grad_logits = torch.compile(_loss_and_grad_logits)


class LinearCrossEntropy(torch.autograd.Function):
    """Sum over rows of cross-entropy(hidden · weightᵀ, labels); rows labelled IGNORE_INDEX count
    0."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size: int, compiled: bool = False):
        loss_and_grad = (
            _compiled_loss_and_grad_logits if compiled else _loss_and_grad_logits_in_place
        )
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows, targets = hidden[start : start + chunk_size], labels[start : start + chunk_size]
            chunk_total, grad_logits = loss_and_grad(rows @ weight.t(), targets, hidden.dtype)
            total += chunk_total
            if grad_hidden is not None:
                torch.matmul(grad_logits, weight, out=grad_hidden[start : start + chunk_size])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), rows)
            # before the next chunk's logits exist: two chunks of logits would be the peak
            del grad_logits
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
            None,
        )


def _chunk_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(
        F.linear(hidden, weight).float(), labels, reduction="sum", ignore_index=IGNORE_INDEX
    )


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
    compiled: bool = False,
    num_loss_tokens: int | None = None,
    every_row: bool = False,
) -> tuple[torch.Tensor, int]:
    """Sum of token losses and the number of rows projected to the vocabulary.

    Only rows with a label are projected; the peak is one chunk of logits. Given
    `num_loss_tokens` (known on the host from the batch), picking those rows does not wait for
    the device; without it, it must. With `every_row`, every row is projected and the ignored
    ones count 0: no picking, shapes that do not depend on the labels.
    """
    if every_row or num_loss_tokens == labels_T.numel():
        hidden, labels = hidden_TD, labels_T
    else:
        supervised = labels_T != IGNORE_INDEX
        keep = (
            supervised.nonzero().squeeze(-1)
            if num_loss_tokens is None
            else torch.nonzero_static(supervised, size=num_loss_tokens).squeeze(-1)
        )
        hidden, labels = hidden_TD.index_select(0, keep), labels_T.index_select(0, keep)
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight_VD.requires_grad):
        total = checkpointed_cross_entropy(hidden, weight_VD, labels, chunk_size, recompute=False)
        return total, labels.numel()
    if fused:
        total = LinearCrossEntropy.apply(hidden, weight_VD, labels, chunk_size, compiled)
        return total, labels.numel()
    return checkpointed_cross_entropy(hidden, weight_VD, labels, chunk_size), labels.numel()
