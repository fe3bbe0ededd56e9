"""`tuneforge plan` on the 8B example without its model or data (the preflight issue's items 3
to 5): an override replaces its key before the environment is read, `--no-data` asks for neither
the data nor a tokenizer and says the steps are unknown, and `--fit` lists distinct recipes,
fastest first, within the GPU's memory."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuneforge.cli.main import app
from tuneforge.config.errors import ConfigError

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "llama3-8b-lora-16gb.yaml")
CATALOG = ["model.path=null", "model.name=llama-3-8b"]


@pytest.fixture(autouse=True)
def no_model_or_data(monkeypatch):
    for name in ("MODEL_DIR", "DATA", "RUN_NAME"):
        monkeypatch.delenv(name, raising=False)


class Planned:
    def __init__(self, *args: str) -> None:
        result = CliRunner().invoke(app, ["plan", EXAMPLE, *args], env={"COLUMNS": "200"})
        self.exit_code = result.exit_code
        self.output = result.output
        self.exception = result.exception
        # what `tuneforge`'s entry point prints of a refusal
        self.text = result.output + (str(result.exception) if result.exception else "")


def plan(*args: str) -> Planned:
    return Planned(*args)


def test_an_override_replaces_its_key_before_the_environment_is_read():
    result = plan(*CATALOG, "--gpu", "H100")
    assert result.exit_code != 0
    assert "MODEL_DIR" not in result.text
    # the data is still asked for, once: as its variable, not also as a missing path
    assert result.text.count("data.train.0.path") == 1, result.text
    assert "environment variable DATA is not set" in result.text


def test_a_plan_without_data_asks_for_no_data_nor_tokenizer_and_has_no_eta():
    result = plan(*CATALOG, "--gpu", "H100", "--no-data")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "steps unknown without the data" in text and "no ETA" in text
    assert "0 steps" not in text and "ETA 00:00:00" not in text
    counted = plan(*CATALOG, "train.max_steps=500", "--gpu", "H100", "--no-data", "--json")
    data = json.loads(counted.output)
    assert data["steps"] == 500 and data["eta_h"] > 0
    unknown = json.loads(plan(*CATALOG, "--gpu", "H100", "--no-data", "--json").output)
    assert unknown["steps"] is None and unknown["eta_h"] is None


def test_fit_lists_distinct_recipes_fastest_first():
    result = plan(*CATALOG, "--gpu", "H100", "--no-data", "--fit", "12", "--json")
    assert result.exit_code == 0, result.output
    recipes = json.loads(result.output)["recipes"]
    assert len(recipes) >= 2
    pasted = [tuple(sorted(recipe["overrides"])) for recipe in recipes]
    assert len(set(pasted)) == len(pasted)
    speeds = [recipe["tokens_per_s"] for recipe in recipes]
    assert speeds == sorted(speeds, reverse=True)


def test_fit_beyond_the_gpus_memory_is_refused():
    result = plan(*CATALOG, "--gpu", "H100", "--no-data", "--fit", "200")
    assert result.exit_code != 0
    assert "--fit 200: more than the 80 GiB" in result.text


def test_a_mesh_the_gpus_cannot_hold_is_refused_as_train_would():
    # the plan's GPUs are the run's processes: 3 cannot hold tensor_parallel 2
    result = plan(
        *CATALOG, "--gpu", "H100", "--no-data", "--gpus", "3", "parallel.tensor_parallel=2"
    )
    assert isinstance(result.exception, ConfigError), result.text
    assert "parallel.tensor_parallel: 2 × parallel.data_parallel_replicate=1 must divide the 3" in (
        result.text
    )
    # a --what-if is not preflighted: the planner refuses it before predicting anything
    asked = plan(*CATALOG, "--gpu", "H100", "--no-data", "--gpus", "4", "--what-if",
                 "parallel.tensor_parallel=3")  # fmt: skip
    assert isinstance(asked.exception, ConfigError), asked.text
    assert "parallel.tensor_parallel: 3 must divide the 32 attention heads" in asked.text
