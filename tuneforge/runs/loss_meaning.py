"""What a run's `loss` is, read from its saved configuration: runs that optimise different
objectives are compared by what they share (the cross-entropy on the data, where both log it;
exact match), never loss against loss as if alike."""

from dataclasses import dataclass
from typing import Any


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


CROSS_ENTROPY = "cross-entropy, nats per supervised token"


def loss_meaning(config: dict[str, Any]) -> LossMeaning:
    train = config.get("train") or {}
    objective = train.get("objective", "sft")
    if objective == "dpo":
        kind = (config.get("dpo") or {}).get("loss", "sigmoid")
        return LossMeaning(f"dpo {kind}", f"DPO {kind} loss per pair", None, None)
    if objective == "distill":
        distill = config.get("distill") or {}
        kind = distill.get("loss", "forward_kl")
        label = f"distillation loss ({kind} mixed with cross-entropy), per supervised token"
        return LossMeaning(f"distill {kind}", label, "ce_loss", "eval_ce_loss")
    return LossMeaning(objective, CROSS_ENTROPY, "loss", "eval_loss")
