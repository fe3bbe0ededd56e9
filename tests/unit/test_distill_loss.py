"""The distillation losses against a direct computation in float64 from the two distributions:
forward and reverse KL, the generalised JSD; zero for a teacher identical to the student; the
cached top-k form equal to the full one when k is the vocabulary."""

import pytest
import torch

from tuneforge.train.objectives.distill_loss import DistillLoss, distill_losses, teacher_top_k


def _logits():
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(6, 50, generator=generator) * 3
    teacher = torch.randn(6, 50, generator=generator) * 3
    return student, teacher


def _direct(loss: str, student, teacher, T: float, beta: float = 0.5) -> torch.Tensor:
    p_s = torch.softmax(student.double() / T, -1)
    p_t = torch.softmax(teacher.double() / T, -1)

    def kl(p, q):
        return (p * (p / q).log()).sum(-1)

    if loss == "forward_kl":
        value = kl(p_t, p_s)
    elif loss == "reverse_kl":
        value = kl(p_s, p_t)
    else:
        m = beta * p_t + (1 - beta) * p_s
        value = beta * kl(p_t, m) + (1 - beta) * kl(p_s, m)
    return value * T * T


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_each_loss_is_its_divergence_times_t_squared(loss, temperature):
    student, teacher = _logits()
    setting = DistillLoss(loss, temperature, jsd_beta=0.3)
    teacher_log_probs = torch.log_softmax(teacher / temperature, -1)
    got = distill_losses(setting, student, teacher_log_probs)
    expected = _direct(loss, student, teacher, temperature, beta=0.3)
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-6)
    # a teacher identical to the student: nothing to learn
    same = distill_losses(setting, student, torch.log_softmax(student / temperature, -1))
    assert same.abs().max().item() < 1e-5
    # the cached form with k = the vocabulary is the full loss
    log_probs, indices = teacher_top_k(teacher, teacher.shape[-1], temperature)
    assert torch.allclose(distill_losses(setting, student, log_probs, indices), got, atol=1e-5)


def test_top_k_keeps_the_teachers_likeliest_tokens_renormalised():
    student, teacher = _logits()
    log_probs, indices = teacher_top_k(teacher, 5, 1.0)
    assert torch.equal(indices, teacher.topk(5, -1).indices)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(6))
    loss = distill_losses(DistillLoss("forward_kl"), student, log_probs, indices)
    expected = (
        log_probs.exp() * (log_probs - torch.log_softmax(student, -1).gather(-1, indices))
    ).sum(-1)
    assert torch.allclose(loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match="one of"):
        DistillLoss("mse")
    with pytest.raises(ValueError, match="between 0 and 1"):
        DistillLoss("jsd", jsd_beta=1.0)
