"""Preference training (DPO, IPO, SimPO) as an objective: a micro-batch holds whole pairs, the
policy's and the reference's log-probabilities of each reply are summed over its supervised
tokens, and the loss is summed over the pairs (the step divides by the pairs of all its
micro-batches); `sft_weight`'s term is summed over the chosen tokens (the step divides by the
chosen tokens of all its micro-batches).

The reference is the model as it was when preference training started (`reference.py`)."""

from typing import Any

import torch

from tuneforge.config.objectives.dpo import DPO, dpo_reference_kind
from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.pairs import (
    REWARD_METRICS,
    Reference,
    chosen_tokens,
    pair_logps_of_hidden,
    reward_sums,
)
from tuneforge.train.objectives.preference_loss import (
    PreferenceLoss,
    preference_losses,
    sft_token_loss_sum,
)
from tuneforge.train.objectives.reference import reference_of
from tuneforge.train.objectives.seam import Objective, ObjectiveOutput, hidden_states_and_aux


class PreferenceObjective(Objective):
    metrics = REWARD_METRICS

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

    def token_units(self, batch: PackedBatch) -> torch.Tensor | int:
        return chosen_tokens(batch) if self.setting.sft_weight else 0

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        reference = None
        if self.setting.needs_reference:
            assert self.reference is not None
            reference = self.reference.logps(batch, self.chunk_tokens)
        hidden, aux = hidden_states_and_aux(self.model, batch)
        policy = pair_logps_of_hidden(hidden, self.model, batch, self.chunk_tokens)
        out = preference_losses(self.setting, policy, reference)
        metrics = reward_sums(out.reward_chosen, out.reward_rejected)
        token_loss = sft_token_loss_sum(self.setting, policy)
        return ObjectiveOutput(out.loss.sum(), aux, metrics, token_loss)

    def resume_state(self) -> dict[str, Any]:
        return self.reference.resume_state() if self.reference is not None else {}


def build(setup: ObjectiveSetup) -> PreferenceObjective:
    dpo = setup.config.dpo
    setting = PreferenceLoss(
        dpo.loss, dpo.beta, dpo.label_smoothing, dpo.simpo_gamma, dpo.sft_weight
    )
    chunk = setup.config.train.loss_chunk_tokens
    reference = reference_of(setup, dpo_reference_kind(setup.config.lora, dpo))
    return PreferenceObjective(setup.model, setting, reference, chunk)


COMPONENT = ObjectiveComponent(DPO, build)
