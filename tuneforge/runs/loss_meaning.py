"""What a run's `loss` is, read from its saved configuration: runs that optimise different
objectives are compared by what they share (the cross-entropy on the data, where both log it;
exact match), never loss against loss as if alike."""

from dataclasses import dataclass
from typing import Any

from tuneforge.config.objectives.registry import OBJECTIVES
from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.base import section_type


@dataclass(frozen=True)
class LossMeaning:
    objective: str
    """The objective as `compare` shows it: "sft", "dpo sigmoid", "distill forward_kl"."""
    label: str
    """What `loss` measures, with its unit."""
    cross_entropy: str | None
    """The training metric holding the cross-entropy per supervised token, if the run logs one."""
    eval_cross_entropy: str | None
    """The same, held out."""


def loss_meaning(config: dict[str, Any]) -> LossMeaning:
    """From a saved configuration (`config.yaml` as a mapping), as its objective declares it."""
    name = (config.get("train") or {}).get("objective", "sft")
    declaration = OBJECTIVES.get(name)
    if declaration is None:  # written by a version with objectives this one lacks
        return LossMeaning(name, f"{name} loss", None, None)
    settings = None
    if declaration.settings is not None:
        section = section_type(RunConfig.model_fields[declaration.settings].annotation)
        assert section is not None
        settings = section.model_construct(**(config.get(declaration.settings) or {}))
    metric = declaration.cross_entropy_metric
    return LossMeaning(
        declaration.short_name(settings),
        declaration.loss_label(settings),
        metric,
        f"eval_{metric}" if metric else None,
    )
