"""Supervised fine-tuning: cross-entropy of each supervised token (chunked, never holding all
fp32 logits at once) plus the MoE load-balancing loss."""

from tuneforge.config.objectives.sft import SFT
from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.train.loss import chunked_cross_entropy
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.seam import Objective, ObjectiveOutput, hidden_states_and_aux


class NextTokenObjective(Objective):
    def __init__(
        self, model: Decoder, loss_chunk_tokens: int = 1024, compiled_loss: bool = False
    ) -> None:
        super().__init__(model)
        self.loss_chunk_tokens = loss_chunk_tokens
        self.fused_loss = True
        """The loss's gradients made in its forward pass (False: the checkpointed reference)."""
        self.compiled_loss = compiled_loss
        """Each chunk's softmax and gradient as one compiled function (with the fused loss)."""

    def units(self, batch: PackedBatch) -> int:
        return batch.num_loss_tokens

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        """`batch.num_loss_tokens` spares the loss a wait for the device to count them."""
        hidden, aux = hidden_states_and_aux(self.model, batch)
        loss_sum, _ = chunked_cross_entropy(
            hidden,
            self.model.lm_head.weight,
            batch.labels,
            self.loss_chunk_tokens,
            self.fused_loss,
            self.compiled_loss,
            batch.num_loss_tokens,
            self.every_row_loss and self.training,
        )
        return ObjectiveOutput(loss_sum, aux, {})


def build(setup: ObjectiveSetup) -> NextTokenObjective:
    train = setup.config.train
    return NextTokenObjective(setup.model, train.loss_chunk_tokens, train.compile)


COMPONENT = ObjectiveComponent(SFT, build)
