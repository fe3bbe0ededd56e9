"""What marks a Hugging Face checkpoint as a sequence classifier (a reward model): its
config.json's architecture. The configuration's rules and the model loader both ask."""

import json
from pathlib import Path
from typing import Any

ARCHITECTURE_SUFFIX = "ForSequenceClassification"


def is_sequence_classifier(config: dict[str, Any]) -> bool:
    """`config` (a config.json's content) names a sequence classifier."""
    return any(str(name).endswith(ARCHITECTURE_SUFFIX) for name in config.get("architectures", []))


def not_a_reward_model(directory: Path) -> str | None:
    """Why `directory` is not a one-label sequence classifier's checkpoint; None where it is."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        return f"{directory} has no config.json: it is not a Hugging Face model directory"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        return f"{config_file} cannot be read as JSON ({error})"
    if not is_sequence_classifier(config):
        names = ", ".join(map(str, config.get("architectures", []))) or "no architecture"
        return f"{directory} holds {names}, not a sequence classifier (a reward model)"
    if config.get("num_labels", len(config.get("id2label", {0: 0}))) != 1:
        return f"{directory} is a classifier of {config.get('num_labels')} labels, not one score"
    return None
