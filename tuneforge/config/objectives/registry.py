"""Every objective a run may train with, by `train.objective`, and the rules they share: the
data format each reads, and the captured step some refuse."""

from typing import Any, Literal

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.objectives.distill import DISTILL
from tuneforge.config.objectives.dpo import DPO
from tuneforge.config.objectives.grpo import GRPO
from tuneforge.config.objectives.orpo import ORPO
from tuneforge.config.objectives.sft import SFT
from tuneforge.config.rules import rule

OBJECTIVES: dict[str, ObjectiveDeclaration] = {d.name: d for d in (SFT, DPO, DISTILL, ORPO, GRPO)}

ObjectiveName = Literal[tuple(OBJECTIVES)]  # type: ignore[valid-type]

OBJECTIVE_HELP = (
    "What the run trains for: "
    + "; ".join(f"`{d.name}` ({d.summary})" for d in OBJECTIVES.values())
    + "."
)


def declaration_of(config: Any) -> ObjectiveDeclaration:
    """The declaration of `config`'s (a RunConfig's) objective."""
    return OBJECTIVES[config.train.objective]


@rule("train", "data")
def prompts_alone_where_replies_are_sampled(train, data) -> list[tuple[str, str, str]]:
    if OBJECTIVES[train.objective].keeps_record_fields:
        return []
    return [
        (
            f"data.{group}.{index}.format",
            f"records of format prompt have no reply, and train.objective: {train.objective} "
            "does not sample one",
            "use them with train.objective: grpo, or give records with replies",
        )
        for group in ("train", "eval")
        for index, source in enumerate(getattr(data, group))
        if source.format == "prompt"
    ]


@rule("train", "data")
def data_in_the_objectives_format(train, data) -> list[tuple[str, str, str]]:
    if OBJECTIVES[train.objective].data_format != "pairs":
        return []
    problems = []
    for group in ("train", "eval"):
        for index, source in enumerate(getattr(data, group)):
            if source.format != "preference":
                problems.append(
                    (
                        f"data.{group}.{index}.format",
                        f"train.objective: {train.objective} trains on pairs, and format "
                        f"{source.format} has none",
                        "set format: preference (prompt, chosen, rejected)",
                    )
                )
    if data.packing == "none":
        problems.append(
            ("data.packing", "pairs are packed whole: packing none is not", "use ffd or bfd")
        )
    return problems


@rule("train")
def captured_step_refused_by_the_objective(train) -> list[tuple[str, str, str]]:
    why = OBJECTIVES[train.objective].refuses_captured_step
    if not (train.cuda_graph and why):
        return []
    return [("train.cuda_graph", why, "drop train.cuda_graph")]
