"""Preference training end to end on the CPU: pairs of the demo's tasks whose rejected reply has a
mistake, LoRA on the demo model, the base without its adapters as the reference. The first
step's loss is ln 2, and the held-out reward accuracy climbs from 0 (no pair told apart) as the
run learns to prefer the right replies."""

import json
import math
import random
import subprocess
import sys

from tests.cli_runs import DEMO, REPO
from tuneforge.runs.files import read_metrics


def _mistake(reply: str, rng: random.Random) -> str:
    words = reply.split()
    if len(words) > 1:
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
        if words != reply.split():
            return " ".join(words)
    return reply + " 1"


def _write_pairs(source, target, count: int) -> None:
    rng = random.Random(0)
    with open(source) as lines, open(target, "w") as out:
        for line, _ in zip(lines, range(count), strict=False):
            messages = json.loads(line)["messages"]
            prompt, reply = messages[0]["content"], messages[1]["content"]
            rejected = _mistake(reply, rng)
            out.write(json.dumps({"prompt": prompt, "chosen": reply, "rejected": rejected}) + "\n")


def test_dpo_starts_at_ln_2_and_learns_to_tell_the_pairs_apart(tmp_path):
    data = REPO / "tuneforge" / "assets" / "demo_data"
    _write_pairs(data / "train.jsonl", tmp_path / "pairs.jsonl", 2000)
    _write_pairs(data / "eval.jsonl", tmp_path / "eval_pairs.jsonl", 100)
    config = tmp_path / "dpo.yaml"
    config.write_text(
        f"extends: {DEMO}\n"
        "data:\n"
        f"  train: [{{path: {tmp_path / 'pairs.jsonl'}, format: preference}}]\n"
        f"  eval: [{{path: {tmp_path / 'eval_pairs.jsonl'}, format: preference}}]\n"
        "lora: {enabled: true, rank: 8, alpha: 16}\n"
        "train: {objective: dpo, max_steps: 40, lr: 5.0e-3, eval_steps: 20, warmup_steps: 2}\n"
        "dpo: {beta: 0.5}\n"
        "eval: {num_samples: 0}\n"
        "logging: {log_steps: 1}\n"
    )
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "train", str(config), f"run.output_dir={run}",
         f"data.cache_dir={tmp_path / 'cache'}", "logging.progress=false", "--overwrite"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_metrics(run / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert abs(steps[0]["loss"] - math.log(2)) < 1e-5
    for key in ("rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy"):
        assert key in steps[-1]
    assert evals[0]["eval_reward_accuracy"] == 0.0
    assert evals[0]["eval_loss"] == pyapprox(math.log(2))
    assert evals[-1]["eval_reward_accuracy"] > 0.8
    assert evals[-1]["eval_loss"] < 0.5 * math.log(2)
    assert "reward accuracy" in result.stdout


def pyapprox(value):
    import pytest

    return pytest.approx(value, abs=1e-5)
