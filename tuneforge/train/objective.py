"""The training forward as one module: decoder, chunked cross-entropy and the MoE load-balancing
loss, so that DDP and FSDP2 wrap the whole computation (the output layer's weight included)."""

import torch
from torch import nn

from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.models.packed import PackedSequences
from tuneforge.train.distributed import gradient_sync
from tuneforge.train.loss import chunked_cross_entropy


class NextTokenObjective(nn.Module):
    def __init__(
        self, model: Decoder, loss_chunk_tokens: int = 1024, compiled_loss: bool = False
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_chunk_tokens = loss_chunk_tokens
        self.fused_loss = True
        """The loss's gradients made in its forward pass (False: the checkpointed reference)."""
        self.compiled_loss = compiled_loss
        """Each chunk's softmax and gradient as one compiled function (with the fused loss)."""
        self.every_row_loss = False
        """Every row projected to the vocabulary, the ignored ones weighted 0 (fixed shapes), in
        training; evaluation, which runs eagerly, projects the supervised rows only."""

    def forward(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        packed: PackedSequences,
        num_loss_tokens: int | None = None,
        real_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token losses, load-balancing loss or 0); `num_loss_tokens`, the labels that
        are not ignored, spares the loss a wait for the device to count them; `real_tokens`
        (on the device) keeps padding at the end out of the load-balancing loss."""
        self.model.record_router_logits(True)
        hidden = self.model.hidden_states(tokens, packed)
        loss_sum, _ = chunked_cross_entropy(
            hidden,
            self.model.lm_head.weight,
            labels,
            self.loss_chunk_tokens,
            self.fused_loss,
            self.compiled_loss,
            num_loss_tokens,
            self.every_row_loss and self.training,
        )
        aux = self.model.aux_loss(real_tokens)
        self.model.record_router_logits(False)
        return loss_sum, aux if aux is not None else loss_sum.new_zeros(())


def backward_micro_batches(
    objective: nn.Module,
    micro_batches: list[PackedBatch],
    scale: float | torch.Tensor,
    aux_weight: float,
) -> torch.Tensor:
    """Backward of `scale x (sum of token losses)` over the micro-batches, plus the load-balancing
    loss weighted by `aux_weight` and averaged over them; gradients are reduced across ranks on
    the last one only. Returns this rank's sum of token losses, on the device (reading it waits
    for the GPU: the caller does so once per step)."""
    total = torch.zeros((), dtype=torch.float64, device=micro_batches[0].labels.device)
    for index, batch in enumerate(micro_batches):
        with gradient_sync(objective, index == len(micro_batches) - 1):
            loss_sum, aux = objective(
                batch.tokens, batch.labels, batch.packed, batch.num_loss_tokens, batch.real_tokens
            )
            loss = loss_sum * scale
            if aux_weight:
                loss = loss + aux_weight * aux / len(micro_batches)
            loss.backward()
        total += loss_sum.detach()
    return total
