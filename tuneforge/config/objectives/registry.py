"""Every objective a run may train with, by `train.objective`, and the rules they share: the
data format each reads, and the captured step some refuse."""

from typing import Any, Literal

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.objectives.distill import DISTILL
from tuneforge.config.objectives.dpo import DPO
from tuneforge.config.objectives.grpo import GRPO
from tuneforge.config.objectives.kto import KTO
from tuneforge.config.objectives.orpo import ORPO
from tuneforge.config.objectives.reward import REWARD
from tuneforge.config.objectives.sft import SFT
from tuneforge.config.rules import rule

OBJECTIVES: dict[str, ObjectiveDeclaration] = {
    d.name: d for d in (SFT, DPO, DISTILL, ORPO, GRPO, KTO, REWARD)
}

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


READS = {"pairs": ("preference",), "unpaired": ("unpaired", "preference")}
"""The record formats an objective of each two-document data format trains on."""


@rule("train", "data")
def data_in_the_objectives_format(train, data) -> list[tuple[str, str, str]]:
    data_format = OBJECTIVES[train.objective].data_format
    problems = []
    for group in ("train", "eval"):
        for index, source in enumerate(getattr(data, group)):
            field = f"data.{group}.{index}.format"
            if data_format == "pairs" and source.format != "preference":
                problems.append(
                    (
                        field,
                        f"train.objective: {train.objective} trains on pairs, and format "
                        f"{source.format} has none",
                        "set format: preference (prompt, chosen, rejected)",
                    )
                )
            if data_format == "unpaired" and source.format not in READS["unpaired"]:
                problems.append(
                    (
                        field,
                        f"train.objective: {train.objective} trains on replies labelled "
                        f"desirable or not, and format {source.format} has no label",
                        "set format: unpaired (prompt, completion, label) or preference "
                        "(prompt, chosen, rejected: the chosen reply desirable, the rejected not)",
                    )
                )
            if data_format == "conversations" and source.format == "unpaired":
                problems.append(
                    (
                        field,
                        "records of format unpaired are replies labelled for KTO, and "
                        f"train.objective: {train.objective} does not read the label",
                        "use them with train.objective: kto",
                    )
                )
    if data_format in READS and data.packing == "none":
        problems.append(
            (
                "data.packing",
                "a record's two documents are packed whole: packing none is not",
                "use ffd or bfd",
            )
        )
    return problems


@rule("train")
def captured_step_refused_by_the_objective(train) -> list[tuple[str, str, str]]:
    why = OBJECTIVES[train.objective].refuses_captured_step
    if not (train.cuda_graph and why):
        return []
    return [("train.cuda_graph", why, "drop train.cuda_graph")]
