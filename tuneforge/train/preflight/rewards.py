"""GRPO's reward functions, checked before any work: each function of yours imported as the
run will import it, and no record field named as an argument every reward function receives."""

from tuneforge.config.errors import ConfigIssue
from tuneforge.config.objectives.grpo import REWARD_ARGUMENTS, REWARD_OPTIONS
from tuneforge.config.objectives.registry import declaration_of
from tuneforge.config.objectives.reward_import import import_reward
from tuneforge.data.reading import read_source
from tuneforge.data.records import RecordError
from tuneforge.train.preflight.check import Inputs


def reward_function_issues(inputs: Inputs) -> list[ConfigIssue]:
    """Each reward function of yours imported (as the run will), where the objective samples."""
    config = inputs.config
    if not declaration_of(config).keeps_record_fields:
        return []
    issues = []
    for index, spec in enumerate(config.grpo.rewards):
        if spec.function in REWARD_OPTIONS:
            continue
        field = f"grpo.rewards.{index}.function"
        try:
            import_reward(spec.function, field)
        except ValueError as error:
            fix = "put its module's directory on PYTHONPATH, or correct the name"
            issues.append(ConfigIssue(field, str(error).removeprefix(f"{field}: "), fix))
    return issues


def record_field_issues(inputs: Inputs) -> list[ConfigIssue]:
    """The records of an objective that samples its replies (local files; a hub dataset is read
    when the run starts): no field named as an argument every reward function is called with
    (the first such record of each source)."""
    config = inputs.config
    if not declaration_of(config).keeps_record_fields:
        return []
    issues = []
    for index, source in enumerate(config.data.train):
        if source.hub is not None:
            continue
        try:
            conversations, _ = read_source(source, config.data.on_bad_record)
        except RecordError:
            continue  # the data's own problems are the data check's, with their line
        for conversation in conversations:
            taken = [name for name in conversation.fields or {} if name in REWARD_ARGUMENTS]
            taken = [name for name in taken if name != "answer" or not conversation.is_prompt]
            if taken:
                issues.append(
                    ConfigIssue(
                        f"data.train.{index}",
                        f"{conversation.origin}: the record has a field named {taken[0]!r}, "
                        "which is an argument every reward function is called with "
                        f"({', '.join(REWARD_ARGUMENTS)})",
                        "rename the field in the data (field_map can rename it as it is read)",
                    )
                )
                break
    return issues
