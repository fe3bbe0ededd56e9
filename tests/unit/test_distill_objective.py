"""The distillation objective on a packed batch: a teacher equal to the student adds nothing to
the cross-entropy, and the loss and the student's gradients equal a direct computation from
both models' full logits (chunked or not, full or top-k teacher); a teacher of another
vocabulary is refused."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_decoder
from tuneforge.data.packing import IGNORE_INDEX, collate
from tuneforge.data.token_store import make_example
from tuneforge.errors import TuneforgeError
from tuneforge.models.args import ModelArgs
from tuneforge.models.decoder import Decoder
from tuneforge.train.frozen.teacher import Teacher
from tuneforge.train.objectives.distill import DistillObjective
from tuneforge.train.objectives.distill_loss import DistillLoss, distill_losses, teacher_top_k
from tuneforge.train.objectives.sft import NextTokenObjective


def _batch():
    generator = torch.Generator().manual_seed(0)
    examples = []
    for length in (9, 14, 6):
        ids = torch.randint(0, 64, (length,), generator=generator).tolist()
        examples.append(make_example(ids, [False] * 3 + [True] * (length - 3)))
    return collate(examples)


def _models(seed_teacher: int = 1):
    torch.manual_seed(0)
    student = tiny_decoder(tied=False)
    torch.manual_seed(seed_teacher)
    teacher = tiny_decoder(tied=False)
    return student, teacher


def test_a_teacher_equal_to_the_student_leaves_the_cross_entropy():
    student, _ = _models()
    twin = tiny_decoder(tied=False)
    twin.load_state_dict(student.state_dict())
    batch = _batch()
    objective = DistillObjective(student, Teacher(twin, student), DistillLoss(), kd_weight=0.5)
    out = objective(batch)
    sft = NextTokenObjective(student)(batch).loss_sum
    assert out.metrics["kd_loss"].abs().item() < 1e-5
    assert out.metrics["ce_loss"].item() == pytest.approx(sft.item(), rel=1e-5)
    assert out.loss_sum.item() == pytest.approx(0.5 * sft.item(), rel=1e-5)
    assert objective.units(batch) == batch.num_loss_tokens


@pytest.mark.parametrize(
    ("loss", "top_k", "chunk"),
    [("forward_kl", None, 4), ("jsd", 7, 1024), ("reverse_kl", None, 1024)],
)
def test_loss_and_gradients_equal_the_direct_computation(loss, top_k, chunk):
    student, teacher = _models()
    batch = _batch()
    setting = DistillLoss(loss, temperature=2.0, jsd_beta=0.3)
    objective = DistillObjective(student, Teacher(teacher, student), setting, 0.7, top_k, chunk)
    out = objective(batch)
    out.loss_sum.backward()
    got = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()
    supervised = batch.labels != IGNORE_INDEX

    def logits(model):  # every row's, the whole vocabulary at once
        return (model.hidden_states(batch.tokens, batch.packed) @ model.lm_head.weight.t())[
            supervised
        ]

    student_logits = logits(student)
    with torch.no_grad():
        teacher_logits = logits(teacher)
    if top_k is None:
        target = (F.log_softmax(teacher_logits / 2.0, -1), None)
    else:
        target = teacher_top_k(teacher_logits, top_k, 2.0)
    kd = distill_losses(setting, student_logits, *target).sum()
    ce = F.cross_entropy(student_logits.float(), batch.labels[supervised], reduction="sum")
    expected = 0.7 * kd + 0.3 * ce
    expected.backward()
    assert out.loss_sum.item() == pytest.approx(expected.item(), rel=1e-4)
    for name, param in student.named_parameters():
        assert torch.allclose(got[name], param.grad, rtol=1e-3, atol=1e-6), name


def test_a_teacher_of_another_vocabulary_is_refused():
    student, _ = _models()
    other = Decoder(
        ModelArgs(vocab_size=80, dim=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_dim=48),
        "sdpa",
    )
    with pytest.raises(TuneforgeError, match="80 tokens and the student's 64"):
        Teacher(other, student)
