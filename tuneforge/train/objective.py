"""The training forward as one module: decoder, chunked cross-entropy and the MoE load-balancing
loss, so that DDP and FSDP2 wrap the whole computation (the output layer's weight included)."""

import torch
from torch import nn

from tuneforge.models.decoder import Decoder
from tuneforge.models.packed import PackedSequences
from tuneforge.train.loss import chunked_cross_entropy


class NextTokenObjective(nn.Module):
    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, tokens: torch.Tensor, labels: torch.Tensor, packed: PackedSequences
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token losses, load-balancing loss or 0)."""
        hidden = self.model.hidden_states(tokens, packed)
        loss_sum, _ = chunked_cross_entropy(hidden, self.model.lm_head.weight, labels)
        aux = self.model.aux_loss()
        return loss_sum, aux if aux is not None else loss_sum.new_zeros(())
