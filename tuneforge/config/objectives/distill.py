"""`train.objective: distill`: knowledge distillation from a teacher, as the configuration
declares it: the `distill:` section, its rules and the teacher it holds."""

from typing import Literal, get_args

from pydantic import Field

from tuneforge.config.objectives.declaration import FrozenModel, ObjectiveDeclaration
from tuneforge.config.rules import rule
from tuneforge.config.sections.base import Section
from tuneforge.config.sections.model import ModelSection

DivergenceName = Literal["forward_kl", "reverse_kl", "jsd"]
DIVERGENCES: tuple[str, ...] = get_args(DivergenceName)


class DistillSection(Section):
    teacher: ModelSection | None = None
    """The teacher: a local model directory or hub id (`path`) or a catalog shape (`name`, random
    weights: a proxy for measuring), with its own `dtype` and `num_layers`; it must share the
    student's vocabulary. A plain string is the path (a directory, `./dir`, or `org/name`) or,
    without a slash, the catalog name."""
    loss: DivergenceName = "forward_kl"
    """KL(teacher ‖ student), KL(student ‖ teacher), or the generalised Jensen-Shannon divergence
    with `jsd_beta`."""
    jsd_beta: float = Field(0.5, gt=0, lt=1)
    """The JSD's mixture weight of the teacher."""
    temperature: float = Field(1.0, gt=0)
    """Both distributions are softened by it; the loss is multiplied by its square."""
    kd_weight: float = Field(0.5, ge=0, le=1)
    """Share of the distillation loss in each token's loss; the cross-entropy on the data takes the
    rest."""
    top_k: int | None = Field(None, ge=1)
    """Distil over the teacher's k likeliest tokens only (renormalised), as a cache of its logits
    keeps them."""
    teacher_logits: Literal["online", "cached"] = "online"
    """`online`: the teacher runs beside the student every step; `cached`: it runs once over the
    data before training and its top-k logits and token ids are kept memory-mapped on disk (keyed by
    the tokenised data and the teacher), so that it need not fit beside the student (needs top_k).
    """


FIELD = "distill.teacher"


def frozen_teacher(distill: DistillSection) -> tuple[FrozenModel, ...]:
    if distill.teacher is None:
        return ()
    if distill.teacher_logits == "cached":
        note = (
            f"its top-{distill.top_k} logits and ids take {8 * (distill.top_k or 0)} bytes per "
            "supervised token on disk"
        )
        return (
            FrozenModel(
                "teacher", "cached", distill.teacher, FIELD, forward_every_step=False, note=note
            ),
        )
    return (FrozenModel("teacher", "online", distill.teacher, FIELD, holds_weights=True),)


DISTILL = ObjectiveDeclaration(
    name="distill",
    summary="the supervised tokens' next-token distributions of the `distill` section's teacher, "
    "with cross-entropy",
    settings="distill",
    reads=("distill",),
    frozen=frozen_teacher,
    title=lambda distill: f"distill {distill.loss}",
    loss_label=lambda distill: (
        f"distillation loss ({distill.loss} mixed with cross-entropy), per supervised token"
    ),
    cross_entropy_metric="ce_loss",
    refuses_captured_step="a distillation step is not captured",
)


@rule("train", "distill")
def distillation_needs_a_teacher(train, distill: DistillSection) -> list[tuple[str, str, str]]:
    problems = []
    distilling = train.objective == DISTILL.name
    if distilling and distill.teacher is None:
        problems.append(
            (
                "distill.teacher",
                "train.objective: distill needs a teacher",
                "set distill.teacher to a model directory, a hub id or a catalog shape",
            )
        )
    teacher = distill.teacher
    if teacher is not None and (teacher.name is None) == (teacher.path is None):
        problems.append(
            (
                "distill.teacher",
                "set exactly one of distill.teacher.name and distill.teacher.path",
                "path loads a local model directory; name builds a catalog shape",
            )
        )
    if distilling and distill.teacher_logits == "cached" and not distill.top_k:
        problems.append(
            (
                "distill.teacher_logits",
                "a cache keeps the teacher's top-k logits of every token, and distill.top_k is "
                "not set (the whole vocabulary for every token would not fit on a disk)",
                "set distill.top_k (64 keeps nearly all of a teacher's probability mass)",
            )
        )
    return problems
