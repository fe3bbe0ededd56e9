"""Preference training (DPO, IPO, SimPO) as an objective: a micro-batch holds whole pairs (the
chosen document, then the rejected one: `data/pairs.py`), the policy's and the reference's
log-probabilities of each reply are summed over its supervised tokens, and the loss is summed
over the pairs (the step divides by the pairs of all its micro-batches).

The reference is the model as it was when preference training started: for a fresh adapter the
base with the adapters disabled (no second copy of the model); otherwise a frozen copy."""

import copy
from abc import ABC, abstractmethod

import torch

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.peft.apply import adapters_disabled
from tuneforge.train.objective import Objective, ObjectiveOutput
from tuneforge.train.preference_loss import PairLogps, PreferenceLoss, preference_losses
from tuneforge.train.sequence_logps import document_sums, token_logps

METRICS = ("rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy")


def pair_logps(model: Decoder, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
    """Each pair's replies' summed log-probabilities under `model` and their token counts."""
    hidden = model.hidden_states(batch.tokens, batch.packed)
    cu_seqlens = batch.packed.cu_seqlens
    logps = document_sums(
        token_logps(hidden, model.lm_head.weight, batch.labels, chunk_tokens), cu_seqlens
    )
    counts = document_sums((batch.labels != IGNORE_INDEX).float(), cu_seqlens)
    return PairLogps(logps[0::2], logps[1::2], counts[0::2], counts[1::2])


class Reference(ABC):
    """The reference model's log-probabilities of a batch's replies, without gradients."""

    @abstractmethod
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps: ...


class AdaptersOffReference(Reference):
    """The policy itself with its adapters disabled: the base a fresh adapter starts from."""

    def __init__(self, model: Decoder) -> None:
        self.model = model

    @torch.no_grad()
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
        with adapters_disabled(self.model):
            return pair_logps(self.model, batch, chunk_tokens)


class FrozenCopyReference(Reference):
    """A frozen copy of the model as it is now (full fine-tuning, or an adapter that continues
    an earlier one)."""

    def __init__(self, model: Decoder) -> None:
        self.model = copy.deepcopy(model).requires_grad_(False).eval()

    @torch.no_grad()
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
        return pair_logps(self.model, batch, chunk_tokens)


class PreferenceObjective(Objective):
    metric_names = METRICS
    per_token_loss = False

    def __init__(
        self,
        model: Decoder,
        setting: PreferenceLoss,
        reference: Reference | None,
        chunk_tokens: int = 1024,
    ) -> None:
        super().__init__(model)
        if setting.needs_reference and reference is None:
            raise ValueError(f"the {setting.loss} loss needs a reference model")
        self.setting = setting
        self.reference = reference
        self.chunk_tokens = chunk_tokens

    def units(self, batch: PackedBatch) -> int:
        return batch.num_documents // 2

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        reference = None
        if self.setting.needs_reference:
            assert self.reference is not None
            reference = self.reference.logps(batch, self.chunk_tokens)
        self.model.record_router_logits(True)
        policy = pair_logps(self.model, batch, self.chunk_tokens)
        aux = self.model.aux_loss(batch.real_tokens)
        self.model.record_router_logits(False)
        out = preference_losses(self.setting, policy, reference)
        chosen, rejected = out.reward_chosen, out.reward_rejected
        metrics = {
            "rewards_chosen": chosen.sum(),
            "rewards_rejected": rejected.sum(),
            "reward_margin": (chosen - rejected).sum(),
            "reward_accuracy": (chosen > rejected).float().sum(),
        }
        loss_sum = out.loss.sum()
        return ObjectiveOutput(
            loss_sum, aux if aux is not None else loss_sum.new_zeros(()), metrics
        )
