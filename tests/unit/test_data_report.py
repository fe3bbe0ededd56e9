import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR
from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.data.chat import Rendering
from tuneforge.data.records import Conversation
from tuneforge.data.report import inspect_data, padded_waste, preview_segments


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)


def test_report_numbers_follow_from_the_tokenised_records(tmp_path, tokenizer):
    records = [
        {"messages": [{"role": "user", "content": "x " * n}, {"role": "assistant", "content": "y"}]}
        for n in range(1, 200, 7)
    ]
    file = tmp_path / "d.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = DataSection(train=[DataSource(path=file)], max_seq_len=256)
    report = inspect_data(data, tokenizer, tokens_per_micro_batch=512)
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in records]
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    assert report.records == len(records)
    assert report.max_length == max(lengths)
    assert report.length_percentiles["p50"] == int(np.percentile(lengths, 50))
    kept = [n for n in lengths if n <= 256]
    assert report.kept == len(kept) and report.dropped_too_long == len(lengths) - len(kept)
    assert report.tokens == sum(kept)
    assert 0 < report.supervised_fraction < 0.5
    assert report.packing_efficiency > 0.9
    assert (
        report.suggested_max_seq_len % 64 == 0
        and report.suggested_max_seq_len >= report.length_percentiles["p99"]
    )


def test_padding_waste_by_hand():
    assert padded_waste([2, 4], 8) == pytest.approx(1 - 6 / 8)  # one batch of two rows of 4
    assert padded_waste([1, 8], 8) == 0.0  # 2 x 8 exceeds the budget: one document each
    assert padded_waste([3, 3, 3], 9) == 0.0


def test_preview_marks_exactly_the_supervised_text(tokenizer):
    conversation = Conversation(
        [{"role": "user", "content": "sort: 3 1"}, {"role": "assistant", "content": "1 3"}], "t:1"
    )
    segments = preview_segments(tokenizer, conversation, Rendering())
    assert [text for text, trained in segments if trained] == ["1 3<|im_end|>"]
    assert "".join(text for text, _ in segments) == tokenizer.apply_chat_template(
        conversation.messages, tokenize=False
    )


def test_demo_data_report(tokenizer):
    data = DataSection(train=[DataSource(path=DEMO_DATA_DIR / "eval.jsonl")], max_seq_len=64)
    report = inspect_data(data, tokenizer, 1024)
    assert report.records == report.kept == 300 and report.without_supervised_tokens == 0


def test_the_report_counts_the_records_the_run_trains_on(tmp_path, tokenizer):
    """Weights repeat or sample a source's records, eval_fraction holds some out: the report
    reads the mix the trainer builds, not the files."""
    from tuneforge.data.training_data import training_conversations

    lines = (DEMO_DATA_DIR / "eval.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:100]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[100:120]) + "\n")
    data = DataSection(
        train=[
            DataSource(path=tmp_path / "a.jsonl"),
            DataSource(path=tmp_path / "b.jsonl", weight=2.5),
        ],
        eval_fraction=0.1,
        max_seq_len=64,
    )
    mix, held_out = training_conversations(data, seed=0)
    report = inspect_data(data, tokenizer, 1024, seed=0)
    assert report.records == len(mix) != 120 and len(held_out) == 12
