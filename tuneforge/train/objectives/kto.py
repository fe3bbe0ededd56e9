"""KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization") as an
objective, as TRL's `KTOTrainer` computes it: each record is a reply labelled desirable or not,
packed beside its mismatched sample (its prompt with another record's reply, `data/unpaired.py`).
With r = log π(reply) − log ρ(reply), ρ the reference, and z the KL reference point (the mean
over the micro-batch's mismatched samples of log π − log ρ, averaged over the data-parallel
ranks, at least 0, no gradient through it), a desirable reply's loss is
λ_D·(1 − σ(β·(r − z))) and an undesirable one's λ_U·(1 − σ(β·(z − r))). The loss is summed over
the records (the step divides by the records of all its micro-batches)."""

from typing import Any

import torch
import torch.distributed as dist

from tuneforge.config.objectives.kto import KTO, kto_reference_kind
from tuneforge.data.packing import PackedBatch
from tuneforge.data.unpaired import LABEL
from tuneforge.models.decoder import Decoder
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.pairs import PairLogps, Reference, pair_logps_of_hidden
from tuneforge.train.objectives.reference import reference_of
from tuneforge.train.objectives.seam import (
    Metric,
    Objective,
    ObjectiveOutput,
    hidden_states_and_aux,
)


def kto_losses(
    policy: PairLogps,
    reference: PairLogps,
    desirable: torch.Tensor,
    beta: float,
    weights: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per record, in fp32: the loss and the reward β·r; and the KL reference point z (0-d).
    `policy`/`reference`: each record's reply (`chosen`) and mismatched sample (`rejected`);
    `desirable` [records] bool; `weights`: (λ_D, λ_U)."""
    kl = (policy.rejected.float() - reference.rejected.float()).mean().detach()
    if dist.is_initialized():  # TRL's gather of each process's estimate, then their mean
        dist.all_reduce(kl, op=dist.ReduceOp.AVG)
    kl = kl.clamp(min=0)
    ratio = policy.chosen.float() - reference.chosen.float()
    desirable_loss = weights[0] * (1 - torch.sigmoid(beta * (ratio - kl)))
    undesirable_loss = weights[1] * (1 - torch.sigmoid(beta * (kl - ratio)))
    loss = torch.where(desirable, desirable_loss, undesirable_loss)
    return loss, beta * ratio.detach(), kl


class KtoObjective(Objective):
    metrics = (
        Metric("kl"),
        Metric("rewards_chosen", per="desirable"),
        Metric("rewards_rejected", per="undesirable"),
        Metric("desirable", per="step", held_out=False),
        Metric("undesirable", per="step", held_out=False),
    )
    """`kl`: the reference point z, averaged over records; `rewards_chosen` / `_rejected`: the
    mean reward of the desirable / undesirable replies (TRL's names); `desirable` /
    `undesirable`: how many of each the step trained on."""

    def __init__(
        self,
        model: Decoder,
        reference: Reference,
        beta: float = 0.1,
        weights: tuple[float, float] = (1.0, 1.0),
        chunk_tokens: int = 1024,
    ) -> None:
        super().__init__(model)
        self.reference = reference
        self.beta = beta
        self.weights = weights
        self.chunk_tokens = chunk_tokens

    def units(self, batch: PackedBatch) -> int:
        return batch.num_documents // 2

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        if batch.record_fields is None:
            raise RuntimeError("a KTO batch without its records' labels")
        labels = [bool(fields[LABEL]) for fields in batch.record_fields[0::2]]
        desirable = torch.tensor(labels).to(batch.labels.device, non_blocking=True)
        reference = self.reference.logps(batch, self.chunk_tokens)
        hidden, aux = hidden_states_and_aux(self.model, batch)
        policy = pair_logps_of_hidden(hidden, self.model, batch, self.chunk_tokens)
        loss, rewards, kl = kto_losses(policy, reference, desirable, self.beta, self.weights)
        count = desirable.float().sum()
        metrics = {
            "kl": kl * len(labels),
            "rewards_chosen": torch.where(desirable, rewards, 0).sum(),
            "rewards_rejected": torch.where(desirable, 0, rewards).sum(),
            "desirable": count,
            "undesirable": len(labels) - count,
        }
        return ObjectiveOutput(loss.sum(), aux, metrics)

    def resume_state(self) -> dict[str, Any]:
        return self.reference.resume_state()


def build(setup: ObjectiveSetup) -> KtoObjective:
    kto = setup.config.kto
    reference = reference_of(setup, kto_reference_kind(setup.config.lora, kto))
    assert reference is not None, "KTO always holds a reference"
    weights = (kto.desirable_weight, kto.undesirable_weight)
    chunk = setup.config.train.loss_chunk_tokens
    return KtoObjective(setup.model, reference, kto.beta, weights, chunk)


COMPONENT = ObjectiveComponent(KTO, build)
