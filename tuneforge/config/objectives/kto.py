"""`train.objective: kto`: Kahneman–Tversky optimisation (Ethayarajh et al. 2024) on replies
labelled desirable or not, against a reference, as the configuration declares it: the `kto:`
section, its rules and the reference it holds (as DPO's)."""

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


class KtoSection(Section):
    beta: float = Field(0.1, gt=0)
    """Strength of the reference's pull: the rewards are β·(log π − log ρ) of each reply."""
    desirable_weight: float = Field(1.0, gt=0)
    """λ_D: the weight of a desirable reply's loss (raise it where desirable replies are fewer)."""
    undesirable_weight: float = Field(1.0, gt=0)
    """λ_U: the weight of an undesirable reply's loss."""
    reference: ReferenceChoice = "auto"
    """The model as it was when preference training started: `adapters_off` (LoRA on a fresh
    adapter: the base with the adapters disabled, no second copy), `frozen_copy` (a frozen copy:
    full fine-tuning, or LoRA continuing `lora.init_adapter`), `precomputed` (its log-probabilities
    of every reply and mismatched sample computed in one pass before training and cached with the
    tokenised data), or `auto` (adapters_off or frozen_copy, the one that applies)."""


def kto_reference_kind(lora, kto: KtoSection) -> str | None:
    return reference_kind(lora, kto.reference)


KTO = ObjectiveDeclaration(
    name="kto",
    summary="replies labelled desirable or not (format unpaired, or preference pairs split), as "
    "the `kto` section says",
    data_format="unpaired",
    settings="kto",
    reads=("lora", "kto"),
    frozen=lambda lora, kto: frozen_reference(kto_reference_kind(lora, kto)),
    loss_label=lambda _: "KTO loss per labelled reply",
    cross_entropy_metric=None,
    refuses_captured_step="a KTO step (the reference's pass, then the policy's) is not captured",
)


@rule("train", "lora", "kto")
def kto_reference(train, lora, kto: KtoSection) -> list[tuple[str, str, str]]:
    if train.objective != KTO.name:
        return []
    return reference_problems("kto.reference", kto.reference, lora)
