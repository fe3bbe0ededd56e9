"""Metrics as JSON lines, one object per logged step or evaluation."""

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, file: Path) -> None:
        self.file = file
        self.file.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with self.file.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def read_metrics(file: Path) -> list[dict[str, Any]]:
    with file.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
