"""The objective seam: an objective turns a packed batch into a loss and metrics. The step and
the loop know only this; next-token SFT is one objective, and others (preference pairs,
distillation) are added beside it without touching them.

An objective is the module that DDP and FSDP2 wrap, so that the whole computation (the output
layer's weight included) runs inside the wrapper."""

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch
from torch import nn

from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import gradient_sync, unwrap
from tuneforge.train.loss import chunked_cross_entropy


class ObjectiveOutput(NamedTuple):
    loss_sum: torch.Tensor
    """0-d: the sum of the batch's per-unit losses; the step divides by the units of all its
    micro-batches on every rank."""
    aux: torch.Tensor
    """0-d: a regulariser added once per micro-batch (the MoE load-balancing loss, or 0)."""
    metrics: dict[str, torch.Tensor]
    """0-d sums over the batch's units, reported per unit with the step's loss."""


class Objective(nn.Module, ABC):
    """`objective(batch)` -> `ObjectiveOutput`; `units(batch)` counts what the loss is summed
    over, on the host (supervised tokens for SFT)."""

    metric_names: tuple[str, ...] = ()
    """The keys of `ObjectiveOutput.metrics`, in a fixed order for the step's reductions."""
    per_token_loss = True
    """The loss is a mean cross-entropy per token (it has a perplexity)."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model
        self.every_row_loss = False
        """Training batches have fixed shapes (a captured step): every row is projected to the
        vocabulary, the ignored ones weighted 0, so that no shape depends on the labels;
        evaluation, which runs eagerly, projects the supervised rows only."""

    @abstractmethod
    def units(self, batch: PackedBatch) -> int: ...

    @abstractmethod
    def forward(self, batch: PackedBatch) -> ObjectiveOutput: ...


class NextTokenObjective(Objective):
    """Supervised fine-tuning: cross-entropy of each supervised token (chunked, never holding all
    fp32 logits at once) plus the MoE load-balancing loss."""

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
        """`batch.num_loss_tokens` spares the loss a wait for the device to count them;
        `batch.real_tokens` (on the device) keeps padding at the end out of the load-balancing
        loss."""
        self.model.record_router_logits(True)
        hidden = self.model.hidden_states(batch.tokens, batch.packed)
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
        aux = self.model.aux_loss(batch.real_tokens)
        self.model.record_router_logits(False)
        return ObjectiveOutput(loss_sum, aux if aux is not None else loss_sum.new_zeros(()), {})


def objective_of(module: nn.Module) -> Objective:
    """The objective inside a DDP wrapper (FSDP2 keeps the module itself)."""
    inner = unwrap(module)
    assert isinstance(inner, Objective), type(inner)
    return inner


def backward_micro_batches(
    objective: nn.Module,
    micro_batches: list[PackedBatch],
    scale: float | torch.Tensor,
    aux_weight: float,
    metric_names: tuple[str, ...] = (),
) -> torch.Tensor:
    """Backward of `scale x (sum of unit losses)` over the micro-batches, plus the regulariser
    weighted by `aux_weight` and averaged over them; gradients are reduced across ranks on the
    last one only. Returns this rank's [loss sum, *metric sums], float64 on the device (reading
    it waits for the GPU: the caller does so once per step)."""
    device = micro_batches[0].labels.device
    total = torch.zeros(1 + len(metric_names), dtype=torch.float64, device=device)
    for index, batch in enumerate(micro_batches):
        with gradient_sync(objective, index == len(micro_batches) - 1):
            output = objective(batch)
            loss = output.loss_sum * scale
            if aux_weight:
                loss = loss + aux_weight * output.aux / len(micro_batches)
            loss.backward()
        total[0] += output.loss_sum.detach()  # one in-place add each, no stacking
        for index, name in enumerate(metric_names, 1):
            total[index] += output.metrics[name].detach()
    return total
