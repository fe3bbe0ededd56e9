"""A model directory must be a Hugging Face model (config.json): a run directory, an adapter or
an empty folder given in its place is named with the field and what to give instead, before
any data is read."""

from pathlib import Path

from tuneforge.config.objectives.distill import DISTILL
from tuneforge.config.objectives.reward import REWARD
from tuneforge.config.rules import rule
from tuneforge.sequence_classifier import not_a_reward_model

RUN_CONFIG = "config.yaml"
"""What a tuneforge run directory holds (`runs/files.py` names it too)."""


def _not_a_model(field: str, directory: Path, teacher: bool) -> tuple[str, str, str] | None:
    if not directory.is_dir() or (directory / "config.json").is_file():
        return None
    if (directory / "adapter_config.json").is_file():
        fix = (
            f"merge it into its base first (tuneforge export merge {directory} --out MERGED) "
            f"and set {field}: MERGED"
            if teacher
            else f"give its base in {field} and the adapter in lora.init_adapter"
        )
        return field, f"{directory} is an adapter (LoRA weights), not a whole model", fix
    if (directory / RUN_CONFIG).is_file():
        if (directory / "final" / "config.json").is_file():
            fix = f"set {field}: {directory / 'final'} (the run's trained weights)"
        elif (directory / "adapter" / "adapter_config.json").is_file():
            fix = f"merge its adapter (tuneforge export merge {directory} --out MERGED) and set {field}: MERGED"
        else:
            fix = "point it at the model the run saved, once the run has finished"
        return field, f"{directory} is a run directory, not a model directory", fix
    return (
        field,
        f"{directory} has no config.json: it is not a Hugging Face model directory",
        "point it at the directory holding the model's config.json and *.safetensors",
    )


@rule("model", "train", "distill")
def model_directories(model, train, distill) -> list[tuple[str, str, str]]:
    problems = []
    if model.path is not None:
        problems.append(_not_a_model("model.path", Path(model.path), teacher=False))
        directory = Path(model.path)
        trains_a_policy = train.objective != REWARD.name and (directory / "config.json").is_file()
        if trains_a_policy and not_a_reward_model(directory) is None:
            problems.append(
                (
                    "model.path",
                    f"{directory} is a reward model (a sequence classifier): it has no output "
                    f"layer to train with train.objective: {train.objective}",
                    "give the model it was trained from, or use it as a GRPO reward "
                    "({function: model, path: DIR})",
                )
            )
    teacher = distill.teacher
    if train.objective == DISTILL.name and teacher is not None and teacher.path is not None:
        problems.append(_not_a_model("distill.teacher.path", Path(teacher.path), teacher=True))
    return [problem for problem in problems if problem is not None]
