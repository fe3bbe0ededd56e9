"""Every check of the preflight (`train/preflight`), run through both commands: `config
validate` refuses what `train` refuses before any weights load, in the same words, and `train`
leaves no run directory behind. A check added without a case here fails the first test."""

import json

import pytest
from typer.testing import CliRunner

from tests.cli_runs import REPO
from tests.helpers import save_tiny_llama
from tuneforge.cli.main import app
from tuneforge.config.errors import ConfigError
from tuneforge.train.preflight import CHECKS

DEMO = str(REPO / "examples" / "demo.yaml")
GRPO = str(REPO / "examples" / "demo-grpo.yaml")
DEMO_MODEL = ["model.path=null", "model.name=demo-tiny"]


def identical_pairs(root):
    file = root / "same.jsonl"
    pair = {"prompt": "add: 1 + 1", "chosen": "2", "rejected": "2"}
    file.write_text(json.dumps(pair) + "\n" + json.dumps(pair) + "\n")
    preference = f"data.train=[{{path: {file}, format: preference}}]"
    no_eval = ["data.eval=[]", "eval.every_steps=null", "eval.num_samples=0"]
    return [preference, *no_eval, "train.objective=dpo"]


def reserved_field(root):
    file = root / "prompts.jsonl"
    file.write_text(json.dumps({"prompt": "sort: 3 1 2", "completions": 1}) + "\n")
    return [f"data.train=[{{path: {file}, format: prompt}}]"]


def small_vocabulary(root):
    save_tiny_llama(root / "model", vocab_size=96)
    return [f"model.path={root / 'model'}", "model.name=null"]


CASES = {
    # check: (configuration, overrides made from a scratch directory, words of the refusal)
    "reward functions": (
        GRPO,
        lambda root: [*DEMO_MODEL, "grpo.rewards=[no_such_rewards_module:score]"],
        "cannot import 'no_such_rewards_module'",
    ),
    "reward arguments": (
        GRPO,
        lambda root: [*DEMO_MODEL, *reserved_field(root)],
        "the record has a field named 'completions'",
    ),
    "mesh sizes": (
        DEMO,
        lambda root: ["parallel.strategy=fsdp", "parallel.tensor_parallel=4"],
        "parallel.tensor_parallel: 4 must divide the 6 attention heads",
    ),
    "tokenizer": (
        DEMO,
        small_vocabulary,
        "tokens but the model's vocabulary holds 96",
    ),
    "data": (DEMO, identical_pairs, "2 whose chosen and rejected replies are the same"),
    "this machine": (
        DEMO,
        lambda root: ["precision.fp8=e4m3", "model.dtype=bfloat16", "lora.enabled=true"],
        "precision.fp8 needs a GPU with FP8 tensor cores",
    ),
}


def test_every_check_has_a_case():
    assert sorted(CASES) == sorted(check.name for check in CHECKS)


def refusal(result) -> list[str]:
    """The problems a command refused with, each as it prints them."""
    if isinstance(result.exception, ConfigError):
        return [str(issue) for issue in result.exception.issues]
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.split("\n")
    return [
        line.removeprefix("this machine: ") for line in lines if line.startswith("this machine: ")
    ]


@pytest.mark.parametrize("check", [check.name for check in CHECKS])
def test_validate_and_train_refuse_alike_and_train_leaves_no_run_directory(
    tmp_path, monkeypatch, check
):
    """In the same environment: one process, as `train` without torchrun runs."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    config, overrides_from, words = CASES[check]
    run = tmp_path / "run"
    overrides = [*overrides_from(tmp_path), f"run.output_dir={run}"]
    runner = CliRunner(env={"COLUMNS": "1000"})
    validated = refusal(runner.invoke(app, ["config", "validate", config, *overrides]))
    assert any(words in issue for issue in validated), validated
    trained = refusal(runner.invoke(app, ["train", config, *overrides]))
    assert set(validated) <= set(trained), (validated, trained)
    assert not run.exists()
