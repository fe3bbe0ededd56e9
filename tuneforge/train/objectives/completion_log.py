"""GRPO's sampled completions as JSON lines (`completions.jsonl` in the run directory): every
`logging.log_steps` steps, the first groups of the step's first sampling, each completion with
its prompt, reference answer, rewards and advantage — what to read when a reward misbehaves."""

import json
from pathlib import Path
from typing import Any

from tuneforge.runs.files import keep_through_step


class CompletionLog:
    def __init__(self, file: Path, groups: int, every_steps: int, iterations: int) -> None:
        self.file, self.groups = file, groups
        self.every_steps, self.iterations = every_steps, iterations

    def due(self, step: int) -> bool:
        """A step that samples (one in `iterations`) logs where a multiple of `every_steps` lies
        among the steps since the last one that sampled."""
        return step // self.every_steps != max(step - self.iterations, 0) // self.every_steps

    def write(self, records: list[dict[str, Any]]) -> None:
        with self.file.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)

    def truncate_after(self, step: int) -> None:
        """Drop the lines of steps after `step` (a resumed run samples them again)."""
        keep_through_step(self.file, step)
