"""`train.objective: orpo`: odds-ratio preference optimisation (Hong et al. 2024) on pairs,
as the configuration declares it: the `orpo:` section. No reference model."""

from pydantic import Field

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.sections.base import Section


class OrpoSection(Section):
    beta: float = Field(0.1, gt=0)
    """λ: the weight of the odds-ratio term beside the chosen reply's negative log-likelihood (TRL's
    `beta`)."""


ORPO = ObjectiveDeclaration(
    name="orpo",
    summary="preference pairs by odds ratio with the chosen reply's cross-entropy, as the `orpo` "
    "section says; no reference model",
    data_format="pairs",
    settings="orpo",
    loss_label=lambda _: "ORPO loss (chosen NLL per token, minus λ·log σ(log odds ratio) per pair)",
    cross_entropy_metric=None,
    refuses_captured_step="a preference step is not captured",
)
