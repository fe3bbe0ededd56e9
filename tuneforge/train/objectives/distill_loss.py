"""Knowledge-distillation losses per token, between the teacher's and the student's next-token
distributions at temperature T (p = softmax(z / T)):

- `forward_kl`: KL(p_teacher ‖ p_student), the student covering every mode of the teacher
  (Hinton et al. 2015);
- `reverse_kl`: KL(p_student ‖ p_teacher), the student settling on the teacher's main modes;
- `jsd`: the generalised Jensen–Shannon divergence of GKD (Agarwal et al. 2024),
  β·KL(p_teacher ‖ m) + (1−β)·KL(p_student ‖ m) with m = β·p_teacher + (1−β)·p_student
  (β → 0 tends to the forward KL's behaviour, β → 1 to the reverse's).

Each is multiplied by T², so that its gradients keep their size as T changes (Hinton et al.).
With `top_k` the teacher is known only on its k most likely tokens (the cached form): its
probabilities renormalised over them, the sums taken over them, the student's log-probabilities
from its full softmax; with k the whole vocabulary this is the full loss."""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tuneforge.config.objectives.distill import DIVERGENCES


@dataclass(frozen=True)
class DistillLoss:
    loss: str = "forward_kl"
    temperature: float = 1.0
    jsd_beta: float = 0.5

    def __post_init__(self) -> None:
        if self.loss not in DIVERGENCES:
            raise ValueError(f"distillation loss must be one of {DIVERGENCES}, not {self.loss!r}")
        if not 0 < self.jsd_beta < 1:
            raise ValueError(f"jsd_beta must be between 0 and 1, not {self.jsd_beta}")


def teacher_top_k(
    teacher_logits: torch.Tensor, k: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities renormalised over the k most likely tokens, their indices), [N, k]:
    what a cache keeps of the teacher."""
    values, indices = (teacher_logits.float() / temperature).topk(k, dim=-1)
    return F.log_softmax(values, dim=-1), indices


def distill_losses(
    setting: DistillLoss,
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    teacher_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """[N] per-token losses, in fp32. `teacher_log_probs` [N, V] (the teacher's full
    distribution at the temperature), or [N, k] over `teacher_indices` [N, k]."""
    T = setting.temperature
    student = F.log_softmax(student_logits.float() / T, dim=-1)
    if teacher_indices is not None:
        student = student.gather(-1, teacher_indices)
    teacher = teacher_log_probs.float()
    if setting.loss == "forward_kl":
        divergence = _kl(teacher, student)
    elif setting.loss == "reverse_kl":
        divergence = _kl(student, teacher)
    else:
        beta = setting.jsd_beta
        weighted = [teacher + math.log(beta), student + math.log(1 - beta)]
        mixture = torch.logsumexp(torch.stack(weighted), dim=0)
        divergence = beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)
    return divergence * T * T


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per row from log-probabilities (0·log 0 taken as 0)."""
    return (log_p.exp() * (log_p - log_q)).nan_to_num(nan=0.0).sum(-1)
