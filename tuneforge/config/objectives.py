"""What a run's objective settings imply beyond their fields, read by the trainer and the
planner alike."""

from tuneforge.config.schema import RunConfig


def preference_reference_kind(config: RunConfig) -> str | None:
    """The reference a preference run holds: `adapters_off` or `frozen_copy`, with `auto` the
    base without its adapters for LoRA on a fresh adapter, a frozen copy otherwise (full
    fine-tuning, or an adapter continued from `lora.init_adapter`); None for SFT,
    distillation and reference-free SimPO."""
    dpo, lora = config.dpo, config.lora
    if config.train.objective != "dpo" or dpo.loss == "simpo":
        return None
    if dpo.reference != "auto":
        return dpo.reference
    return "adapters_off" if lora.enabled and lora.init_adapter is None else "frozen_copy"
