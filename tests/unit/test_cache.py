"""The tokenised-data cache: hits when nothing changed, misses when anything did, atomic writes."""

import datetime
import json
import shutil
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.config.sections.data import DataSource
from tuneforge.data import cache as cache_module
from tuneforge.data.cache import cached_examples
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import build_examples
from tuneforge.data.packing import PackedLoader
from tuneforge.data.reading import read_conversations
from tuneforge.data.records import ORIGIN_FIELD
from tuneforge.data.token_store import TokenStore

OPTIONS = {"max_seq_len": 64, "on_too_long": "drop", "train_on": "assistant"}


def record(question: str, answer: str) -> dict:
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }


@pytest.fixture
def setup(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps(record(f"sort: {i} 1", f"1 {i}")) + "\n" for i in range(2, 9))
    )
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    return data, tokenizer, tmp_path / "cache"


def load(data, tokenizer, cache, options=OPTIONS, calls=None, field_map=None):
    def build():
        if calls is not None:
            calls.append(1)
        conversations, _ = read_conversations(data, "openai")
        return build_examples(
            conversations, tokenizer, options["max_seq_len"], options["on_too_long"], Rendering()
        )

    source = DataSource(path=data, field_map=field_map or {})
    return cached_examples([source], tokenizer, options, cache, build)


def test_second_load_is_a_hit_with_identical_examples(setup):
    data, tokenizer, cache = setup
    calls: list[int] = []
    first, stats = load(data, tokenizer, cache, calls=calls)
    second, again = load(data, tokenizer, cache, calls=calls)
    assert calls == [1]
    assert [second[i] for i in range(len(second))] == [first[i] for i in range(len(first))]
    assert again == stats and second.lengths == first.lengths


def test_record_fields_kept_by_the_examples_come_back_from_the_cache(setup):
    """Each document keeps its record's other fields where asked (GRPO's rewards read them):
    written beside the arrays, read back on a hit, carried by every batch of the documents."""
    data, tokenizer, cache = setup
    lines = data.read_text().splitlines()
    data.write_text(
        "".join(json.dumps(json.loads(line) | {"n": i}) + "\n" for i, line in enumerate(lines))
    )
    conversations, _ = read_conversations(data, "openai")
    options = OPTIONS | {"record_fields": True}

    def build():
        return build_examples(conversations, tokenizer, 64, "drop", Rendering(), keep_fields=True)

    first, _ = cached_examples([DataSource(path=data)], tokenizer, options, cache, build)
    second, _ = cached_examples([DataSource(path=data)], tokenizer, options, cache, lambda: 1 / 0)
    origins = [f"{data}:{i + 1}" for i in range(len(lines))]  # so a reward can name its record
    expected = [{"n": i, ORIGIN_FIELD: origin} for i, origin in enumerate(origins)]
    assert first.fields == second.fields == expected
    loader = PackedLoader(second, 64, seed=0)
    for batch in loader.fixed_batches():
        assert batch.record_fields is not None
        assert len(batch.record_fields) == batch.num_documents
        for fields, start in zip(
            batch.record_fields, batch.packed.cu_seqlens[:-1].tolist(), strict=True
        ):
            prompt = tokenizer.decode(batch.tokens[start : start + 12].tolist())
            assert f"sort: {fields['n'] + 2} 1" in prompt  # the record's own document
    plain, _ = load(data, tokenizer, cache)
    assert plain.fields is None
    # a value JSON cannot hold (a parquet date) is its text built or cached alike
    dated = [replace(conversations[0], fields={"when": datetime.date(2026, 1, 2)})]
    built, _ = build_examples(dated, tokenizer, 64, "drop", Rendering(), keep_fields=True)
    assert built[0].fields == {"when": "2026-01-02", ORIGIN_FIELD: dated[0].origin}


def test_token_store_round_trips_examples(setup):
    data, tokenizer, _ = setup
    conversations, _ = read_conversations(data, "openai")
    examples, _ = build_examples(conversations, tokenizer, 64, "drop", Rendering())
    store = TokenStore.from_examples(examples)
    assert [store[i] for i in range(len(store))] == examples


@pytest.mark.parametrize("change", ["contents", "template", "options", "field_map", "code"])
def test_any_change_is_a_miss(setup, change, monkeypatch, tmp_path):
    data, tokenizer, cache = setup
    code = tmp_path / "code"  # a copy of the document-building modules, edited below
    shutil.copytree(cache_module.DOCUMENT_CODE, code, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_module, "DOCUMENT_CODE", code)
    calls: list[int] = []
    load(data, tokenizer, cache, calls=calls)
    options = OPTIONS
    if change == "contents":  # same file name, one character different
        data.write_text(data.read_text().replace("sort: 2 1", "sort: 3 1"))
    elif change == "template":
        tokenizer.chat_template = tokenizer.chat_template.replace("\\n", "\\n ")
    elif change == "options":
        options = OPTIONS | {"max_seq_len": 32}
    elif change == "code":  # an upgrade that changes how a conversation is rendered
        chat = code / "chat.py"
        chat.write_text(chat.read_text() + "\n# rendered otherwise\n")
    field_map = {"messages": "messages"} if change == "field_map" else None
    load(data, tokenizer, cache, options, calls=calls, field_map=field_map)
    assert calls == [1, 1]


def test_a_failed_build_writes_nothing(setup):
    data, tokenizer, cache = setup
    data.write_text(data.read_text() + "{broken\n")
    with pytest.raises(Exception, match="invalid JSON"):
        load(data, tokenizer, cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_records_left_out_are_reported_on_a_cache_hit_too(tmp_path, setup, caplog):
    from tuneforge.config.sections.data import DataSection
    from tuneforge.data.training_data import load_training_data

    data, tokenizer, cache = setup
    with data.open("a") as file:
        file.write(json.dumps(record("sort: " + " ".join(["9"] * 80), "9")) + "\n")
    section = DataSection(
        train=[{"path": str(data)}], max_seq_len=64, on_too_long="drop", cache_dir=cache
    )
    for attempt in ("tokenised", "cached"):
        caplog.clear()
        with caplog.at_level("INFO"):
            load_training_data(section, tokenizer, tokens_per_micro_batch=128, seed=0)
        assert ("from cache" in caplog.text) == (attempt == "cached")
        assert "1 of 8 record(s) are longer than data.max_seq_len=64" in caplog.text, attempt
        assert "train data: 8 records (7 kept)" in caplog.text, attempt
