"""What a run's objective settings imply beyond their fields, read by the trainer and the
planner alike."""

from tuneforge.config.schema import RunConfig


def preference_reference_kind(config: RunConfig) -> str | None:
    """The reference a preference run holds: `adapters_off`, `frozen_copy` or `precomputed`,
    with `auto` the base without its adapters for LoRA on a fresh adapter, a frozen copy
    otherwise (full fine-tuning, or an adapter continued from `lora.init_adapter`); None for
    SFT, distillation and reference-free SimPO."""
    dpo, lora = config.dpo, config.lora
    if config.train.objective != "dpo" or dpo.loss == "simpo":
        return None
    if dpo.reference != "auto":
        return dpo.reference
    return "adapters_off" if lora.enabled and lora.init_adapter is None else "frozen_copy"


def teacher_runs_online(config: RunConfig) -> bool:
    """A distillation run whose teacher is held beside the student and runs every step (not
    read from its cached logits)."""
    distill = config.distill
    return config.train.objective == "distill" and distill.teacher_logits == "online"
