"""GRPO's completion log: which sampling steps write, and a resume's rewrite."""

import json

from tuneforge.train.objectives.completion_log import CompletionLog


def test_the_first_sampling_step_at_or_after_each_multiple_writes(tmp_path):
    """With num_iterations 2 only odd steps sample: every 5 steps, steps 5 and 11 write."""
    log = CompletionLog(tmp_path / "completions.jsonl", 1, every_steps=5, iterations=2)
    assert [step for step in range(1, 13, 2) if log.due(step)] == [5, 11]
    every = CompletionLog(tmp_path / "c.jsonl", 1, every_steps=3, iterations=1)
    assert [step for step in range(1, 10) if every.due(step)] == [3, 6, 9]


def test_a_resume_drops_the_lines_after_its_checkpoint(tmp_path):
    file = tmp_path / "completions.jsonl"
    log = CompletionLog(file, 1, every_steps=1, iterations=1)
    log.write([{"step": step, "completion": str(step)} for step in (1, 2, 3)])
    log.truncate_after(2)
    assert [json.loads(line)["step"] for line in file.read_text().splitlines()] == [1, 2]
