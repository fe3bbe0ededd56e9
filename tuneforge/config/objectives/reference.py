"""The reference a preference objective compares against (DPO's, KTO's): the model as it was
when preference training started, as a section's `reference` field chooses to hold it, what the
planner counts for it, and the choices refused."""

from typing import Literal

from tuneforge.config.objectives.declaration import FrozenModel, starting_model_kind

ReferenceChoice = Literal["auto", "adapters_off", "frozen_copy", "precomputed"]


def reference_kind(lora, reference: str, reference_free: bool = False) -> str | None:
    """The reference held: `adapters_off`, `frozen_copy` or `precomputed`, with `auto` the base
    without its adapters for LoRA on a fresh adapter, a frozen copy otherwise (full fine-tuning,
    or an adapter continued from `lora.init_adapter`); None for a reference-free loss."""
    if reference_free:
        return None
    if reference != "auto":
        return reference
    return starting_model_kind(lora)


def frozen_reference(kind: str | None) -> tuple[FrozenModel, ...]:
    """What the planner counts for a reference held as `kind`."""
    if kind is None:
        return ()
    if kind == "precomputed":
        note = "its log-probability of each reply cached: none per step"
        return (FrozenModel("reference", kind, forward_every_step=False, note=note),)
    return (FrozenModel("reference", kind, holds_weights=kind == "frozen_copy"),)


def reference_problems(field: str, reference: str, lora) -> list[tuple[str, str, str]]:
    """A `reference` choice (at config field `field`) that cannot hold the starting model."""
    problems = []
    if reference == "adapters_off" and not lora.enabled:
        problems.append(
            (
                field,
                "adapters_off is the base without its adapters: it needs LoRA",
                f"set lora.enabled: true, or {field}: frozen_copy (or auto)",
            )
        )
    if reference == "adapters_off" and lora.enabled and lora.init_adapter is not None:
        problems.append(
            (
                field,
                "with lora.init_adapter the run starts from that adapter, and adapters_off would "
                "compare with the base without it",
                f"set {field}: frozen_copy (or auto)",
            )
        )
    return problems
