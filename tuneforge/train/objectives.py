"""Which objective a run trains with, from its configuration: next-token SFT, or preference
training with its reference (made before the model is wrapped, as the model is then)."""

from tuneforge.config.schema import RunConfig, TrainSection
from tuneforge.models.decoder import Decoder
from tuneforge.train.objective import NextTokenObjective, Objective
from tuneforge.train.preference import (
    AdaptersOffReference,
    FrozenCopyReference,
    PreferenceObjective,
    Reference,
)
from tuneforge.train.preference_loss import PreferenceLoss


def preference_reference(config: RunConfig, model: Decoder) -> Reference | None:
    """The reference of a preference run (None for SFT and reference-free SimPO): with `auto`,
    the base without its adapters for LoRA on a fresh adapter, a frozen copy otherwise (full
    fine-tuning, or an adapter continued from `lora.init_adapter`)."""
    dpo, lora = config.dpo, config.lora
    if config.train.objective != "dpo" or dpo.loss == "simpo":
        return None
    fresh_adapter = lora.enabled and lora.init_adapter is None
    adapters_off = dpo.reference == "adapters_off" or (dpo.reference == "auto" and fresh_adapter)
    return AdaptersOffReference(model) if adapters_off else FrozenCopyReference(model)


def build_objective(
    train: TrainSection,
    model: Decoder,
    config: RunConfig | None = None,
    reference: Reference | None = None,
) -> Objective:
    """The objective the run trains with (`config` for a preference run's settings)."""
    if train.objective == "dpo":
        assert config is not None
        dpo = config.dpo
        setting = PreferenceLoss(
            dpo.loss, dpo.beta, dpo.label_smoothing, dpo.simpo_gamma, dpo.sft_weight
        )
        return PreferenceObjective(model, setting, reference, train.loss_chunk_tokens)
    return NextTokenObjective(model, train.loss_chunk_tokens, train.compile)
