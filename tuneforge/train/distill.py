"""Knowledge distillation as an objective: on each supervised token the student's loss is
kd_weight · D(teacher ‖ student) + (1 − kd_weight) · cross-entropy on the data, D one of
`distill_loss.py`'s divergences. The teacher runs its forward on the same packed batch without
gradients; the student's logits are made a chunk of supervised rows at a time and recomputed
in backward, so at most one chunk's fp32 logits of each model exist."""

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.train.distill_loss import DistillLoss, distill_losses, teacher_top_k
from tuneforge.train.objective import Objective, ObjectiveOutput

Targets = Callable[[slice], tuple[torch.Tensor, torch.Tensor | None]]
"""The teacher's log-probabilities of a chunk of the supervised rows (and the token ids they are
over, with top-k), at the loss's temperature."""


class TeacherSource(Protocol):
    """Where a distillation step's teacher distribution comes from: the teacher run on the
    batch (`Teacher`), or its logits cached before training (`cached_teacher.CachedTeacher`)."""

    def targets(
        self, batch: PackedBatch, supervised: torch.Tensor, temperature: float, top_k: int | None
    ) -> Targets: ...


def check_vocabulary(teacher_vocab: int, student_vocab: int) -> None:
    if teacher_vocab != student_vocab:
        raise TuneforgeError(
            f"distill.teacher: its vocabulary has {teacher_vocab} tokens and the student's "
            f"{student_vocab}: distillation compares their next-token distributions, so "
            "they must share the tokenizer (use a teacher of the student's family)"
        )


class Teacher:
    """The frozen teacher model, run on each batch (held outside the objective's modules: DDP
    and FSDP2 wrap the student only)."""

    def __init__(self, model: Decoder, student: Decoder) -> None:
        check_vocabulary(model.args.vocab_size, student.args.vocab_size)
        self.model = model.requires_grad_(False).eval()

    @torch.no_grad()
    def targets(
        self, batch: PackedBatch, supervised: torch.Tensor, temperature: float, top_k: int | None
    ) -> Targets:
        rows = self.model.hidden_states(batch.tokens, batch.packed).index_select(0, supervised)
        head = self.model.lm_head.weight

        @torch.no_grad()
        def chunk(part: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
            logits = rows[part] @ head.t()
            if top_k is not None:
                return teacher_top_k(logits, top_k, temperature)
            return F.log_softmax(logits.float() / temperature, dim=-1), None

        return chunk


class DistillObjective(Objective):
    metric_names = ("kd_loss", "ce_loss")
    per_token_loss = False  # a mix of divergence and cross-entropy: no perplexity

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
        supervised = (batch.labels != IGNORE_INDEX).nonzero().squeeze(-1)
        targets = self.teacher.targets(batch, supervised, self.setting.temperature, self.top_k)
        self.model.record_router_logits(True)
        student_rows = self.model.hidden_states(batch.tokens, batch.packed)
        student_rows = student_rows.index_select(0, supervised)
        aux = self.model.aux_loss(batch.real_tokens)
        self.model.record_router_logits(False)
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
        return ObjectiveOutput(
            loss_sum, aux if aux is not None else loss_sum.new_zeros(()), metrics
        )

    def _chunk_losses(self, hidden, weight, labels, teacher_log_probs, teacher_indices):
        logits = (hidden @ weight.t()).float()
        kd = distill_losses(self.setting, logits, teacher_log_probs, teacher_indices).sum()
        ce = F.cross_entropy(logits, labels, reduction="sum")
        return kd, ce
