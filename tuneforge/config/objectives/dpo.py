"""`train.objective: dpo`: preference training on pairs (DPO, IPO, SimPO) against a reference,
as the configuration declares it: the `dpo:` section, its rules and the reference it holds."""

from typing import Literal, get_args

from pydantic import Field

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.objectives.reference import (
    ReferenceChoice,
    frozen_reference,
    reference_kind,
    reference_problems,
)
from tuneforge.config.rules import rule
from tuneforge.config.sections.base import Section

PreferenceLossName = Literal["sigmoid", "ipo", "simpo"]
PREFERENCE_LOSSES: tuple[str, ...] = get_args(PreferenceLossName)
REFERENCE_FREE = frozenset({"simpo"})
"""Losses on the policy's log-probabilities alone: no reference model is held or run."""


class DpoSection(Section):
    loss: PreferenceLossName = "sigmoid"
    """`sigmoid` (DPO), `ipo` (on the replies' per-token mean log-ratios, as TRL takes it), or
    `simpo` (reference-free, on the replies' mean log-probabilities, with `simpo_gamma`)."""
    beta: float = Field(0.1, gt=0)
    """Strength of the reference's pull (DPO, IPO), or SimPO's reward scale."""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """The probability that a pair's preference is flipped (conservative DPO; sigmoid and simpo)."""
    simpo_gamma: float = Field(0.5, ge=0)
    """SimPO's target margin between the chosen and rejected rewards."""
    sft_weight: float = Field(0.0, ge=0)
    """Weight of the chosen replies' negative log-likelihood per token, over all the chosen tokens
    of the step (SFT's normalisation), added to the mean of the pairs' losses."""
    reference: ReferenceChoice = "auto"
    """The model as it was when preference training started: `adapters_off` (LoRA on a fresh
    adapter: the base with the adapters disabled, no second copy), `frozen_copy` (a frozen copy:
    full fine-tuning, or LoRA continuing `lora.init_adapter`), `precomputed` (its log-probabilities
    of every reply computed in one pass before training and cached with the tokenised data: no copy
    and no reference forward per step), or `auto` (adapters_off or frozen_copy, the one that
    applies)."""


def dpo_reference_kind(lora, dpo: DpoSection) -> str | None:
    return reference_kind(lora, dpo.reference, dpo.loss in REFERENCE_FREE)


DPO = ObjectiveDeclaration(
    name="dpo",
    summary="preference pairs, DPO, IPO or SimPO as the `dpo` section says",
    data_format="pairs",
    settings="dpo",
    reads=("lora", "dpo"),
    frozen=lambda lora, dpo: frozen_reference(dpo_reference_kind(lora, dpo)),
    title=lambda dpo: f"dpo {dpo.loss}",
    loss_label=lambda dpo: (
        f"DPO {dpo.loss} loss per pair"
        + (" plus the chosen NLL per token" if dpo.sft_weight else "")
    ),
    cross_entropy_metric=None,
    refuses_captured_step="a preference step (the reference's pass, then the policy's) is not "
    "captured",
)


@rule("train", "lora", "dpo")
def preference_reference(train, lora, dpo: DpoSection) -> list[tuple[str, str, str]]:
    if train.objective != DPO.name:
        return []
    problems = reference_problems("dpo.reference", dpo.reference, lora)
    if dpo.reference == "precomputed" and dpo.loss in REFERENCE_FREE:
        problems.append(
            (
                "dpo.reference",
                f"{dpo.loss} is reference-free: there is nothing to precompute",
                "drop dpo.reference (or use loss sigmoid or ipo)",
            )
        )
    if dpo.loss == "ipo" and dpo.label_smoothing:
        problems.append(
            (
                "dpo.label_smoothing",
                "label smoothing applies to the sigmoid and simpo losses; ipo has none",
                "drop dpo.label_smoothing, or use dpo.loss: sigmoid (conservative DPO)",
            )
        )
    return problems
