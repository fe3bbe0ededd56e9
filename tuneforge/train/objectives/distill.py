"""Knowledge distillation as an objective: on each supervised token the student's loss is
kd_weight · D(teacher ‖ student) + (1 − kd_weight) · cross-entropy on the data, D one of
`distill_loss.py`'s divergences. The teacher runs its forward on the same packed batch without
gradients (or its logits were cached before training); the student's logits are made a chunk of
supervised rows at a time and recomputed in backward, so at most one chunk's fp32 logits of each
model exist."""

import logging

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tuneforge.config.objectives.distill import DISTILL
from tuneforge.data.packing import PackedBatch
from tuneforge.models.cost import parameter_count
from tuneforge.models.decoder import Decoder
from tuneforge.precision.apply import quantize_frozen_base
from tuneforge.train.build import build_model
from tuneforge.train.frozen.cached_teacher import cached_teacher
from tuneforge.train.frozen.passes import supervised_rows
from tuneforge.train.frozen.teacher import Teacher, TeacherSource
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.distill_loss import DistillLoss, distill_losses
from tuneforge.train.objectives.seam import (
    Metric,
    Objective,
    ObjectiveOutput,
    hidden_states_and_aux,
)

log = logging.getLogger(__name__)


class DistillObjective(Objective):
    metrics = (Metric("kd_loss"), Metric("ce_loss"))

    def __init__(
        self,
        model: Decoder,
        teacher: TeacherSource,
        setting: DistillLoss,
        kd_weight: float,
        top_k: int | None = None,
        chunk_tokens: int = 1024,
    ) -> None:
        super().__init__(model)
        self.teacher = teacher
        self.setting = setting
        self.kd_weight = kd_weight
        self.top_k = top_k
        self.chunk_tokens = chunk_tokens

    def units(self, batch: PackedBatch) -> int:
        return batch.num_loss_tokens

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        supervised = supervised_rows(batch)
        targets = self.teacher.targets(batch, supervised, self.setting.temperature, self.top_k)
        hidden, aux = hidden_states_and_aux(self.model, batch)
        student_rows = hidden.index_select(0, supervised)
        labels = batch.labels.index_select(0, supervised)
        kd_sum = ce_sum = student_rows.new_zeros((), dtype=torch.float32)
        for start in range(0, labels.shape[0], self.chunk_tokens):
            rows = slice(start, start + self.chunk_tokens)
            kd, ce = checkpoint(
                self._chunk_losses,
                student_rows[rows],
                self.model.lm_head.weight,
                labels[rows],
                *targets(rows),
                use_reentrant=False,
            )
            kd_sum, ce_sum = kd_sum + kd, ce_sum + ce
        loss_sum = self.kd_weight * kd_sum + (1 - self.kd_weight) * ce_sum
        metrics = {"kd_loss": kd_sum.detach(), "ce_loss": ce_sum.detach()}
        return ObjectiveOutput(loss_sum, aux, metrics)

    def _chunk_losses(self, hidden, weight, labels, teacher_log_probs, teacher_indices):
        logits = (hidden @ weight.t()).float()
        kd = distill_losses(self.setting, logits, teacher_log_probs, teacher_indices).sum()
        ce = F.cross_entropy(logits, labels, reduction="sum")
        return kd, ce


def teacher_of(setup: ObjectiveSetup) -> TeacherSource:
    """The teacher loaded frozen beside the student, or its logits cached before training."""
    config = setup.config
    (frozen,) = DISTILL.frozen_models(config)
    section = frozen.model
    assert section is not None

    def load() -> Decoder:
        model, arrived = build_model(section, setup.device, config.train.seed)
        if section.quantize:  # a frozen teacher in 4 bits
            model.requires_grad_(False)
            report = quantize_frozen_base(
                model, section.quantize, section.double_quant, None, arrived
            )
            report.log(log)
        log.info(
            "teacher: %s, %s parameters, %s", section.path or section.name,
            parameter_count(model.args.num_params()), section.dtype,
        )  # fmt: skip
        return model

    if frozen.kind == "online":
        if setup.dims.sharded:
            log.info("teacher: its blocks sharded across the %d ranks", setup.dims.world_size)
        return Teacher(load(), setup.model, setup.dims.sharded)
    assert setup.passes is not None, "a cached teacher needs the training data"
    return cached_teacher(load, setup.model, setup.passes, config.train.loss_chunk_tokens)


def build(setup: ObjectiveSetup) -> DistillObjective:
    distill, train = setup.config.distill, setup.config.train
    divergence = DistillLoss(distill.loss, distill.temperature, distill.jsd_beta)
    return DistillObjective(
        setup.model,
        teacher_of(setup),
        divergence,
        distill.kd_weight,
        distill.top_k,
        train.loss_chunk_tokens,
    )


COMPONENT = ObjectiveComponent(DISTILL, build)
