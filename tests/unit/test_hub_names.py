"""Models and tokenizers named by hub id, resolved offline from a Hugging Face cache that the
test builds on disk (the hub's own layout: refs naming commits, snapshots by commit)."""

import pytest

from tests.helpers import issues_of, save_tiny_llama
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.config import ConfigError, load_config

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
    (directory / "train.jsonl").write_text('{"text": "hello"}\n')
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
