"""Which objective a run trains with, from its configuration: next-token SFT, preference
training with its reference (made before the model is wrapped, as the model is then), or
distillation from a teacher."""

import logging

from tuneforge.config.objectives import preference_reference_kind, teacher_runs_online
from tuneforge.config.schema import RunConfig, TrainSection
from tuneforge.models.cost import parameter_count
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import shard_frozen
from tuneforge.precision.apply import quantize_frozen_base
from tuneforge.train.build import build_model
from tuneforge.train.cached_teacher import cached_teacher
from tuneforge.train.distill import DistillObjective, Teacher, TeacherSource
from tuneforge.train.distill_loss import DistillLoss
from tuneforge.train.frozen_passes import FrozenPassData
from tuneforge.train.objective import NextTokenObjective, Objective
from tuneforge.train.precomputed_reference import precomputed_reference
from tuneforge.train.preference import (
    AdaptersOffReference,
    FrozenCopyReference,
    PreferenceObjective,
    Reference,
)
from tuneforge.train.preference_loss import PreferenceLoss

log = logging.getLogger(__name__)


def frozen_models(
    passes: FrozenPassData, model: Decoder, resuming: bool
) -> tuple[Reference | None, TeacherSource | None]:
    """A preference run's reference and a distillation run's teacher, made before the model is
    wrapped (as it is then); a precomputed reference or a cached teacher runs its pass here."""
    reference = preference_reference(passes.config, model, passes, resuming)
    return reference, distillation_teacher(passes.config, model, passes)


def preference_reference(
    config: RunConfig, model: Decoder, passes: FrozenPassData, resuming: bool = False
) -> Reference | None:
    """The reference of a preference run, as `preference_reference_kind` names it."""
    kind = preference_reference_kind(config)
    if kind is None:
        return None
    if kind == "precomputed":
        return precomputed_reference(model, passes, config.train.loss_chunk_tokens, resuming)
    if kind == "adapters_off":
        return AdaptersOffReference(model)
    reference = FrozenCopyReference(model)
    if passes.strategy == "fsdp":
        shard_frozen(reference.model.layers, reference.model.lm_head.weight.dtype)
        log.info("reference: the frozen copy's blocks sharded across the ranks")
    return reference


def distillation_teacher(
    config: RunConfig, student: Decoder, passes: FrozenPassData
) -> TeacherSource | None:
    """The teacher of a distillation run, loaded frozen on `device`, or its logits cached before
    training (None for other objectives)."""
    section = config.distill.teacher
    if config.train.objective != "distill" or section is None:
        return None

    def load() -> Decoder:
        model = build_model(section, passes.world.device, config.train.seed)
        if section.quantize:  # a frozen teacher in 4 bits
            model.requires_grad_(False)
            quantize_frozen_base(model, section.quantize, section.double_quant).log(log)
        log.info(
            "teacher: %s, %s parameters, %s", section.path or section.name,
            parameter_count(model.args.num_params()), section.dtype,
        )  # fmt: skip
        return model

    if teacher_runs_online(config):
        teacher = Teacher(load(), student)
        if passes.strategy == "fsdp":
            shard_frozen(teacher.model.layers, teacher.model.lm_head.weight.dtype)
            log.info("teacher: its blocks sharded across the %d ranks", passes.world.world_size)
        return teacher
    return cached_teacher(load, student, passes, config.train.loss_chunk_tokens)


def build_objective(
    train: TrainSection,
    model: Decoder,
    config: RunConfig | None = None,
    reference: Reference | None = None,
    teacher: TeacherSource | None = None,
) -> Objective:
    """The objective the run trains with (`config` for a preference or distillation run's
    settings)."""
    if train.objective == "distill":
        assert config is not None and teacher is not None
        distill = config.distill
        divergence = DistillLoss(distill.loss, distill.temperature, distill.jsd_beta)
        return DistillObjective(
            model, teacher, divergence, distill.kd_weight, distill.top_k, train.loss_chunk_tokens
        )
    if train.objective == "dpo":
        assert config is not None
        dpo = config.dpo
        preference = PreferenceLoss(
            dpo.loss, dpo.beta, dpo.label_smoothing, dpo.simpo_gamma, dpo.sft_weight
        )
        return PreferenceObjective(model, preference, reference, train.loss_chunk_tokens)
    return NextTokenObjective(model, train.loss_chunk_tokens, train.compile)
