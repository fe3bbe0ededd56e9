"""Preference training end to end on the CPU: the demo's pairs (its tasks, the rejected reply with
one mistake), LoRA on the demo model, the base without its adapters as the reference. The first
step's loss is ln 2, and the held-out reward accuracy climbs from 0 (no pair told apart) as the
run learns to prefer the right replies."""

import math
import subprocess
import sys

from tests.cli_runs import DEMO, REPO, assert_clean_failure
from tuneforge.runs.files import read_metrics


def _write_pairs(source, target, count: int) -> None:
    """The first `count` of the demo's bundled pairs (`tuneforge/assets/build_demo_pairs.py`)."""
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:count]))


def _preference_run(tmp_path, objective: str) -> tuple[list[dict], str]:
    """40 steps of the demo's pairs with LoRA; (metrics lines, stdout)."""
    data = REPO / "tuneforge" / "assets" / "demo_data"
    _write_pairs(data / "pairs_train.jsonl", tmp_path / "pairs.jsonl", 2000)
    _write_pairs(data / "pairs_eval.jsonl", tmp_path / "eval_pairs.jsonl", 100)
    config = tmp_path / "preference.yaml"
    config.write_text(
        f"extends: {DEMO}\n"
        "data:\n"
        f"  train: [{{path: {tmp_path / 'pairs.jsonl'}, format: preference}}]\n"
        f"  eval: [{{path: {tmp_path / 'eval_pairs.jsonl'}, format: preference}}]\n"
        "lora: {enabled: true, rank: 8, alpha: 16}\n"
        f"train: {{objective: {objective}, max_steps: 40, lr: 5.0e-3, warmup_steps: 2}}\n"
        "dpo: {beta: 0.5}\n"
        "orpo: {beta: 1.0}\n"
        "eval: {every_steps: 20, num_samples: 0}\n"
        "logging: {log_steps: 1}\n"
    )
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "train", str(config), f"run.output_dir={run}",
         f"data.cache_dir={tmp_path / 'cache'}", "logging.progress=false", "--overwrite"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return read_metrics(run / "metrics.jsonl"), result.stdout


def test_dpo_starts_at_ln_2_and_learns_to_tell_the_pairs_apart(tmp_path):
    records, stdout = _preference_run(tmp_path, "dpo")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert abs(steps[0]["loss"] - math.log(2)) < 1e-5
    for key in ("rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy"):
        assert key in steps[-1]
    assert evals[0]["eval_reward_accuracy"] == 0.0
    assert evals[0]["eval_loss"] == pyapprox(math.log(2))
    assert evals[-1]["eval_reward_accuracy"] > 0.6  # of pairs whose replies differ in one item
    assert evals[-1]["eval_loss"] < 0.8 * math.log(2)
    assert "reward accuracy" in stdout


def test_orpo_learns_the_chosen_replies_and_to_tell_the_pairs_apart(tmp_path):
    """No reference: the chosen replies' cross-entropy falls and the odds ratio rises."""
    records, stdout = _preference_run(tmp_path, "orpo")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    for key in ("nll_loss", "log_odds_ratio", "log_odds_chosen", "reward_accuracy"):
        assert key in steps[-1] and f"eval_{key}" in evals[-1]
    assert evals[-1]["eval_nll_loss"] < 0.5 * evals[0]["eval_nll_loss"]
    assert evals[-1]["eval_log_odds_chosen"] > evals[0]["eval_log_odds_chosen"]
    assert evals[-1]["eval_reward_accuracy"] > 0.6
    assert "reward accuracy" in stdout and "nll loss" in stdout


def test_kto_on_pairs_split_and_unpaired_records_separates_the_rewards(tmp_path):
    """KTO on the demo's pairs split into labelled replies beside records of format unpaired:
    every record's loss starts at 1 − σ(0) = 0.5 (the policy is the reference), and the
    undesirable replies' rewards fall below the desirable ones' on held-out records."""
    import json

    data = REPO / "tuneforge" / "assets" / "demo_data"
    _write_pairs(data / "pairs_train.jsonl", tmp_path / "pairs.jsonl", 800)
    _write_pairs(data / "pairs_eval.jsonl", tmp_path / "eval_pairs.jsonl", 100)
    unpaired = []
    for line in (data / "pairs_train.jsonl").read_text().splitlines()[800:1200]:
        pair = json.loads(line)
        for reply, label in ((pair["chosen"], True), (pair["rejected"], False)):
            record = {"prompt": pair["prompt"], "completion": reply, "label": label}
            unpaired.append(json.dumps(record) + "\n")
    (tmp_path / "unpaired.jsonl").write_text("".join(unpaired))
    train = (
        f"data.train=[{{path: {tmp_path / 'pairs.jsonl'}, format: preference}}, "
        f"{{path: {tmp_path / 'unpaired.jsonl'}, format: unpaired}}]"
    )
    held_out = f"data.eval=[{{path: {tmp_path / 'eval_pairs.jsonl'}, format: preference}}]"
    run = tmp_path / "run"
    result = _train(
        str(DEMO), f"run.output_dir={run}", train, held_out, "train.objective=kto",
        "train.max_steps=40", "train.lr=2e-3", "train.warmup_steps=2", "kto.beta=0.5",
        "train.tokens_per_micro_batch=4096",
        "lora.enabled=true", "lora.rank=8", "lora.alpha=16", "eval.every_steps=20",
        "eval.num_samples=0", "logging.log_steps=1", f"data.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_metrics(run / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert steps[0]["loss"] == pyapprox(0.5)
    assert steps[0]["desirable"] + steps[0]["undesirable"] > 0
    assert evals[0]["eval_loss"] == pyapprox(0.5)
    assert evals[-1]["eval_loss"] < 0.47
    assert evals[-1]["eval_rewards_rejected"] < evals[-1]["eval_rewards_chosen"] - 0.2
    assert "rewards rejected" in result.stdout


def _train(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tuneforge", "train", *args, "logging.progress=false"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_an_adapter_continued_from_an_sft_run_starts_where_it_ended(tmp_path):
    """SFT, then SFT again from its adapter (held-out loss at step 0 is the first run's last),
    then DPO from it (the reference a frozen copy of the model with that adapter: ln 2 at the
    first step); an adapter of another alpha is refused."""
    data = REPO / "tuneforge" / "assets" / "demo_data"
    _write_pairs(data / "pairs_train.jsonl", tmp_path / "pairs.jsonl", 400)
    _write_pairs(data / "pairs_eval.jsonl", tmp_path / "eval_pairs.jsonl", 50)
    common = [f"data.cache_dir={tmp_path / 'cache'}", "eval.num_samples=0", "eval.every_steps=15"]
    common += ["lora.enabled=true", "lora.rank=8", "lora.alpha=16", "logging.log_steps=1"]
    sft = tmp_path / "sft"
    first = _train(str(DEMO), f"run.output_dir={sft}", "train.max_steps=15", *common)
    assert first.returncode == 0, first.stdout + first.stderr
    adapter = sft / "adapter"
    again = tmp_path / "again"
    second = _train(
        str(DEMO), f"run.output_dir={again}", "train.max_steps=2", f"lora.init_adapter={adapter}",
        *common,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    ended = [r["eval_loss"] for r in read_metrics(sft / "metrics.jsonl") if "eval_loss" in r]
    started = [r["eval_loss"] for r in read_metrics(again / "metrics.jsonl") if "eval_loss" in r]
    assert started[0] == pyapprox(ended[-1])
    dpo = tmp_path / "dpo"
    pairs = f"data.train=[{{path: {tmp_path / 'pairs.jsonl'}, format: preference}}]"
    held_out = f"data.eval=[{{path: {tmp_path / 'eval_pairs.jsonl'}, format: preference}}]"
    third = _train(
        str(DEMO), f"run.output_dir={dpo}", "train.max_steps=2", f"lora.init_adapter={adapter}",
        "train.objective=dpo", pairs, held_out, *common,
    )  # fmt: skip
    assert third.returncode == 0, third.stdout + third.stderr
    steps = [r for r in read_metrics(dpo / "metrics.jsonl") if "loss" in r]
    assert steps[0]["loss"] == pyapprox(math.log(2))
    other = _train(
        str(DEMO), f"run.output_dir={tmp_path / 'other'}", f"lora.init_adapter={adapter}",
        *common, "lora.alpha=32",
    )  # fmt: skip
    assert_clean_failure(other, "lora.alpha 32.0 (the adapter's 16.0)")


def pyapprox(value):
    import pytest

    return pytest.approx(value, abs=1e-5)


def test_a_reward_model_trains_saves_as_a_classifier_and_rewards_grpo(tmp_path):
    """A reward model with LoRA on the demo's pairs (margins on some records): the held-out
    loss falls from ln 2's neighbourhood; `final/` loads in transformers as a one-label sequence
    classifier; GRPO then runs two steps with it as its reward."""
    import json

    import torch
    import transformers

    data = REPO / "tuneforge" / "assets" / "demo_data"
    lines = (data / "pairs_train.jsonl").read_text().splitlines()[:1500]
    records = [
        json.loads(line) | ({"margin": 0.5} if i % 3 == 0 else {}) for i, line in enumerate(lines)
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _write_pairs(data / "pairs_eval.jsonl", tmp_path / "eval_pairs.jsonl", 100)
    run = tmp_path / "reward"
    result = _train(
        str(DEMO), f"run.output_dir={run}", "train.objective=reward",
        f"data.train=[{{path: {tmp_path / 'pairs.jsonl'}, format: preference}}]",
        f"data.eval=[{{path: {tmp_path / 'eval_pairs.jsonl'}, format: preference}}]",
        "train.max_steps=30", "train.lr=3e-3", "train.warmup_steps=2", "lora.enabled=true",
        "lora.rank=8", "lora.alpha=16", "eval.every_steps=30", "logging.log_steps=1",
        "reward.center_rewards_coefficient=0.01", f"data.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    evals = [r for r in read_metrics(run / "metrics.jsonl") if "eval_loss" in r]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert "eval_reward_accuracy" in evals[-1] and "eval_accuracy" not in evals[-1]
    final = run / "final"
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(final)
    assert classifier.config.num_labels == 1
    with torch.no_grad():
        assert classifier(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 1)

    grpo = tmp_path / "grpo"
    result = _train(
        str(REPO / "examples" / "demo-grpo.yaml"), f"run.output_dir={grpo}",
        "model.path=null", "model.name=demo-tiny",
        f"grpo.rewards=[{{function: model, path: {final}}}]", "train.max_steps=2",
        "eval.every_steps=null", "eval.num_samples=0", "logging.log_steps=1",
        f"data.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [r for r in read_metrics(grpo / "metrics.jsonl") if "loss" in r]
    assert len(steps) == 2 and all("reward_model" in r for r in steps)
    refused = _train(str(REPO / "examples" / "demo.yaml"), f"model.path={final}")
    assert refused.returncode != 0 and "is a reward model" in refused.stdout + refused.stderr
