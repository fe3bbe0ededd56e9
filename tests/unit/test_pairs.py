"""Preference records as pairs of documents: the chosen and rejected conversations share the
prompt's tokens, only each last reply is supervised, and pairs that cannot be trained whole are
left out or refused."""

import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import report_left_out
from tuneforge.data.formats import to_conversation
from tuneforge.data.pairs import pair_examples
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.token_store import IGNORE_INDEX


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)


def _record(index: int, chosen: str, rejected: str) -> Conversation:
    raw = {"prompt": "sort: 3 1 2", "chosen": chosen, "rejected": rejected}
    return to_conversation(raw, "preference", {}, f"pairs.jsonl:{index}")


def _data(**settings) -> DataSection:
    return DataSection(train=[DataSource(path="pairs.jsonl", format="preference")], **settings)


def test_each_pair_shares_its_prompt_and_trains_only_on_each_reply(tokenizer):
    records = [_record(1, "1 2 3", "3 2 1"), _record(2, "1 2 3", "1 3 2 2 2")]
    examples, stats = pair_examples(records, tokenizer, _data(), Rendering(), 512)
    assert len(examples) == 4 and stats.num_records == 2
    for pair in range(2):
        chosen, rejected = examples[2 * pair], examples[2 * pair + 1]
        first = next(i for i, label in enumerate(chosen.labels) if label != IGNORE_INDEX)
        assert chosen.input_ids[: first + 1] == rejected.input_ids[: first + 1]  # the prompt
        assert all(label == IGNORE_INDEX for label in rejected.labels[:first])
        replies = [
            tokenizer.decode([t for t in example.labels if t != IGNORE_INDEX])
            for example in (chosen, rejected)
        ]
        assert replies[0].startswith("1 2 3") and replies[1].startswith(records[pair].rejected)


def test_pairs_are_never_truncated_and_records_without_a_rejected_reply_are_refused(tokenizer):
    long = _record(1, "1 2 3", " ".join(["9"] * 200))
    short = _record(2, "1 2 3", "3 2 1")
    examples, stats = pair_examples(
        [long, short], tokenizer, _data(on_too_long="drop"), Rendering(), 128
    )
    assert len(examples) == 2 and stats.num_dropped_too_long == 1
    with pytest.raises(DataError, match=r"pairs\.jsonl:1: its pair has .* never truncated"):
        pair_examples([long, short], tokenizer, _data(on_too_long="error"), Rendering(), 128)
    plain = Conversation(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "chat.jsonl:3"
    )
    with pytest.raises(DataError, match=r"chat\.jsonl:3: preference training needs pairs"):
        pair_examples([plain], tokenizer, _data(), Rendering(), 128)


def test_the_demo_pairs_are_its_replies_against_one_mistake_each():
    import json
    import random

    from tuneforge.assets import DEMO_DATA_DIR
    from tuneforge.assets.build_demo_pairs import mistake

    rng = random.Random(0)
    for prompt, reply in [("add: 0 + 0", "0"), ("max: 7 7", "7"), ("sort: 1 1 2", "1 1 2")]:
        for _ in range(20):
            assert mistake(prompt, reply, rng) != reply
    source = (DEMO_DATA_DIR / "train.jsonl").read_text().splitlines()
    pairs = (DEMO_DATA_DIR / "pairs_train.jsonl").read_text().splitlines()
    for line, pair_line in zip(source, pairs, strict=False):
        messages, pair = json.loads(line)["messages"], json.loads(pair_line)
        assert (pair["prompt"], pair["chosen"]) == (messages[0]["content"], messages[1]["content"])
        assert pair["rejected"] != pair["chosen"]


def test_pairs_with_the_same_reply_twice_are_counted_left_out_and_refused_when_all(
    tokenizer, caplog
):
    """Such a pair trains at loss log 2 with zero gradient: it teaches nothing, and a file of
    only such pairs would save an unchanged adapter without a word."""
    same = [_record(1, "1 2 3", "1 2 3"), _record(3, "1 2 3", "1 2 3")]
    examples, stats = pair_examples(
        [same[0], _record(2, "1 2 3", "3 2 1"), same[1]], tokenizer, _data(), Rendering(), 512
    )
    assert len(examples) == 2 and stats.num_identical_pairs == 2
    assert stats.identical_examples == ["pairs.jsonl:1", "pairs.jsonl:3"]
    report_left_out(stats, 512)
    assert "2 pair(s) have the same chosen and rejected reply" in caplog.text
    with pytest.raises(DataError, match="2 whose chosen and rejected replies are the same"):
        pair_examples(same, tokenizer, _data(), Rendering(), 512)
