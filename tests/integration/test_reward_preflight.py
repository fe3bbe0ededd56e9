"""A GRPO run's reward functions and records are checked before any work: `config validate`
refuses each mistake, naming its field and the fix, without loading torch or the model, and
`train` refuses it with the same message before it makes its run directory."""

import json
import sys

import pytest

from tests.cli_runs import REPO, run_cli

GRPO = REPO / "examples" / "demo-grpo.yaml"


def issue_lines(text: str) -> list[str]:
    """The refusal's problems, as both commands print them."""
    return [line for line in text.splitlines() if line.startswith(("  - ", "      fix:"))]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    prompts = [{"prompt": "sort: 3 1 2", "answer": "1 2 3"}]
    (root / "reserved.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [*prompts, {"prompt": "p", "completions": 1}])
    )
    pairs = REPO / "tuneforge" / "assets" / "demo_data" / "pairs_train.jsonl"
    return {"reserved": root / "reserved.jsonl", "pairs": pairs}


CASES = {
    "pattern": (
        ["grpo.rewards=[{function: regex, pattern: '[a-'}]"],
        "grpo.rewards.0.pattern: '[a-' is no regular expression",
    ),
    "function": (
        ["grpo.rewards=[no_such_rewards_module:score]"],
        "grpo.rewards.0.function: cannot import 'no_such_rewards_module'",
    ),
    "option": (
        ["grpo.rewards=[{function: exact_match, pattern: x}]"],
        "grpo.rewards.0.pattern: exact_match takes no option",
    ),
    "preference": (
        ["data.train=[{path: PAIRS, format: preference}]"],
        "data.train.0.format: GRPO samples its own replies",
    ),
    "reserved": (
        ["data.train=[{path: RESERVED, format: prompt}]"],
        "reserved.jsonl:2: the record has a field named 'completions'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validate_and_train_refuse_alike_before_any_work(tmp_path, data, case):
    overrides, said = CASES[case]
    paths = {"PAIRS": str(data["pairs"]), "RESERVED": str(data["reserved"])}
    for placeholder, path in paths.items():
        overrides = [o.replace(placeholder, path) for o in overrides]
    run = tmp_path / "run"
    common = [*overrides, "model.path=null", "model.name=demo-tiny", f"run.output_dir={run}"]
    validated = run_cli("config", "validate", str(GRPO), *common)
    assert validated.returncode == 2 and said in validated.stderr, validated.stderr
    assert "Traceback" not in validated.stderr
    trained = run_cli("train", str(GRPO), *common)
    assert trained.returncode == 2 and "Traceback" not in trained.stderr, trained.stderr
    assert issue_lines(trained.stderr) == issue_lines(validated.stderr)
    assert not run.exists()


def test_validate_loads_no_torch(tmp_path):
    """Without the data (`--no-data`: no tokenizer to load), the checks import the reward
    functions and read the records, nothing heavier."""
    import subprocess

    probe = (
        "import sys; from tuneforge.cli.main import main; sys.argv = ['tuneforge', 'config', "
        f"'validate', '--no-data', {str(GRPO)!r}, 'model.path=null', 'model.name=demo-tiny'];\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr
