"""Models and tokenizers named by hub id, resolved offline from a Hugging Face cache that the
test builds on disk (the hub's own layout: refs naming commits, snapshots by commit)."""

import json

import pytest

from tests.helpers import issues_of, save_tiny_llama
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.config import ConfigError, load_config
from tuneforge.config.loading import dump_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TAGGED = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """`org/tiny` at main (and tag v1 at another commit) in a cache of its own, offline."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    for ref, commit in (("main", COMMIT), ("v1", TAGGED)):
        save_tiny_llama(repo / "snapshots" / commit, vocab_size=384)
        for file in DEMO_TOKENIZER_DIR.iterdir():
            (repo / "snapshots" / commit / file.name).write_bytes(file.read_bytes())
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo


def write_config(directory, model: str, extra: str = "") -> object:
    config = directory / "run.yaml"
    config.write_text(
        f"model:\n  path: {model}\n  dtype: float32\n{extra}"
        "data:\n  train:\n    - path: train.jsonl\ntrain:\n  max_steps: 1\n"
    )
    record = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    }
    (directory / "train.jsonl").write_text(json.dumps(record) + "\n")
    return config


def test_a_hub_id_resolves_to_its_cached_snapshot_and_commit(tmp_path, hub_cache):
    config = load_config(write_config(tmp_path, "org/tiny"))
    assert config.model.path == hub_cache / "snapshots" / COMMIT
    assert config.model.revision == COMMIT  # what the run's config.yaml records
    tagged = load_config(write_config(tmp_path, "org/tiny", "  revision: v1\n"))
    assert tagged.model.path == hub_cache / "snapshots" / TAGGED and tagged.model.revision == TAGGED
    tokenizer = load_config(write_config(tmp_path, "org/tiny", "tokenizer:\n  path: org/tiny\n"))
    assert tokenizer.tokenizer.path == hub_cache / "snapshots" / COMMIT


def test_offline_and_not_cached_is_a_clear_error_at_the_line(tmp_path, hub_cache):
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path, "org/missing"))
    message = issues_of(raised.value)["model.path"]
    assert "org/missing is not in the Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    assert "run.yaml:2" in str(raised.value)


def test_a_local_directory_named_like_a_hub_id_wins(tmp_path, hub_cache):
    save_tiny_llama(tmp_path / "org" / "tiny")
    config = load_config(write_config(tmp_path, "org/tiny"))
    assert config.model.path == tmp_path / "org" / "tiny" and config.model.revision is None


README = """---
configs:
- config_name: plain
  data_files:
  - split: train
    path: plain/train.jsonl
  - split: validation
    path: plain/validation.jsonl
- config_name: other
  data_files:
  - split: train
    path: other/train.jsonl
---
"""


def qa(question: str, answer: str) -> str:
    return json.dumps({"instruction": question, "output": answer}) + "\n"


@pytest.fixture
def dataset_cache(tmp_path, monkeypatch):
    """`org/qa` in a hub cache of its own: two subsets, their splits in its README, offline."""
    snapshot = tmp_path / "hub" / "datasets--org--qa" / "snapshots" / COMMIT
    for subset, split, rows in (
        ("plain", "train", [qa("1+1?", "2"), qa("2+2?", "4")]),
        ("plain", "validation", [qa("3+3?", "6")]),
        ("other", "train", [qa("red?", "colour")]),
    ):
        (snapshot / subset).mkdir(parents=True, exist_ok=True)
        (snapshot / subset / f"{split}.jsonl").write_text("".join(rows))
    (snapshot / "README.md").write_text(README)
    (tmp_path / "hub" / "datasets--org--qa" / "refs").mkdir()
    (tmp_path / "hub" / "datasets--org--qa" / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_dataset_reads_the_subset_and_split_asked_for(tmp_path, dataset_cache):
    pytest.importorskip("datasets")
    from tuneforge.data.reading import read_source

    save_tiny_llama(tmp_path / "model")
    source = "    - {hub: org/qa, subset: plain, split: validation, format: alpaca}\n"
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: model}}\ndata:\n  train:\n{source}train: {{max_steps: 1}}\n")
    loaded = load_config(config)
    train = loaded.data.train[0]
    assert train.path == dataset_cache and train.revision == COMMIT
    conversations, _ = read_source(train, "error")
    assert [c.messages[-1]["content"] for c in conversations] == ["6"]
    other = train.model_copy(update={"subset": "other", "split": "train"})
    assert [c.messages[-1]["content"] for c in read_source(other, "error")[0]] == ["colour"]
    recorded = tmp_path / "recorded.yaml"  # a run's config.yaml, read again to resume
    recorded.write_text(dump_config(loaded))
    assert load_config(recorded).data.train[0] == train
    config.write_text(config.read_text().replace("org/qa", "org/absent"))
    with pytest.raises(ConfigError, match="org/absent is not in the Hugging Face cache"):
        load_config(config)


def test_validate_show_and_plan_fetch_a_hub_models_configuration_not_its_weights(
    tmp_path, hub_cache, monkeypatch
):
    """They need config.json and the tokenizer; `train` needs the weights too."""
    import huggingface_hub
    from typer.testing import CliRunner

    from tuneforge.cli.main import app

    asked = []

    def snapshot_download(repo_id, **kwargs):
        asked.append(kwargs["allow_patterns"])
        return str(hub_cache / "snapshots" / COMMIT)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    config = write_config(tmp_path, "org/tiny")
    for command in (["config", "show"], ["config", "validate"], ["plan", "--no-data"]):
        result = CliRunner().invoke(app, [*command, str(config)])
        assert result.exit_code == 0, (command, result.output, result.exception)
    assert len(asked) >= 3 and all("*.safetensors" not in patterns for patterns in asked)
    load_config(config)  # as `train` loads it
    assert "*.safetensors" in asked[-1]


def test_a_mistyped_relative_directory_is_no_such_directory_not_a_hub_id(tmp_path, hub_cache):
    (tmp_path / "models").mkdir()
    with pytest.raises(ConfigError, match=r"no such file or directory: .*models/llama-3-8b"):
        load_config(write_config(tmp_path, "models/llama-3-8b"))


def test_a_path_without_its_directory_is_said_to_be_no_such_directory(tmp_path, hub_cache):
    """`models/llama-3-8b` with no `models/` beside the configuration could be a hub id or a
    mistyped path: the refusal names both readings, the missing directory first."""
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, "models/llama-3-8b"))
    said = str(error.value)
    assert f"no such directory: {tmp_path / 'models' / 'llama-3-8b'}" in said
    assert "read as a hub id" in said and "not in the Hugging Face cache" in said
