"""One length policy: the documents the data pipeline builds are the ones the planner predicts
from the records' lengths and targets, for every `on_too_long` and `split_long`, pieces without
targets and truncated records whose last label is cut off included."""

import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import build_examples
from tuneforge.data.length_policy import RecordLengths, has_targets, target_spans
from tuneforge.data.reading import read_conversations
from tuneforge.data.records import Conversation
from tuneforge.data.token_store import IGNORE_INDEX


@pytest.fixture(scope="module")
def conversations():
    found = read_conversations(DEMO_DATA_DIR / "train.jsonl", "openai")[0][:200]
    # a long prompt with a short reply: split pieces of the prompt carry no loss
    long_prompt = "reverse: " + " ".join("abcdefghij" * 6)
    return [*found, Conversation([{"role": "user", "content": long_prompt},
                                  {"role": "assistant", "content": "j"}], "long")]  # fmt: skip


@pytest.mark.parametrize(
    ("on_too_long", "split_long"), [("truncate", False), ("drop", False), ("drop", True)]
)
@pytest.mark.parametrize("max_seq_len", [24, 40, 64])
def test_the_planner_predicts_the_documents_the_data_pipeline_builds(
    conversations, on_too_long, split_long, max_seq_len
):
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER_DIR))
    examples, stats = build_examples(
        conversations, tokenizer, max_seq_len, on_too_long, Rendering(), split_long=split_long
    )
    predicted = stats.records.documents(max_seq_len, on_too_long, split_long)
    assert sorted(predicted) == sorted(len(example.input_ids) for example in examples)
    assert stats.num_tokens == sum(len(example.input_ids) for example in examples)
    targets = sum(label != IGNORE_INDEX for example in examples for label in example.labels)
    assert stats.num_loss_tokens == targets
    assert all(any(label != IGNORE_INDEX for label in e.labels) for e in examples)
    blind = RecordLengths(stats.raw_lengths).documents(max_seq_len, on_too_long, split_long)
    if split_long:  # lengths alone count the pieces without targets too
        assert len(blind) > len(predicted)


def test_target_spans_are_the_supervised_label_positions():
    mask = [False, False, True, True, False, True]
    assert target_spans(mask) == (1, 3, 4, 5)  # labels 1, 2 and 4 predict targets 2, 3 and 5
    spans = target_spans(mask)
    assert has_targets((4, 6), spans, truncated=False)
    assert not has_targets((0, 1), spans, truncated=False)
    assert not has_targets((0, 2), spans, truncated=True)  # label 1 predicts a token cut off
    assert has_targets((0, 2), spans, truncated=False)
