"""A distillation teacher: where each step's teacher distribution comes from, the teacher run
on the batch (`Teacher`) or its logits cached before training (`cached_teacher.py`)."""

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from tuneforge.data.packing import PackedBatch
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import shard_frozen
from tuneforge.train.objectives.distill_loss import teacher_top_k

Targets = Callable[[slice], tuple[torch.Tensor, torch.Tensor | None]]
"""The teacher's log-probabilities of a chunk of the supervised rows (and the token ids they are
over, with top-k), at the loss's temperature."""


class TeacherSource(Protocol):
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
    and FSDP2 wrap the student only; under FSDP2 its blocks are sharded too)."""

    def __init__(self, model: Decoder, student: Decoder, sharded: bool = False) -> None:
        check_vocabulary(model.args.vocab_size, student.args.vocab_size)
        self.model = model.requires_grad_(False).eval()
        if sharded:
            shard_frozen(self.model.layers, self.model.lm_head.weight.dtype)

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
