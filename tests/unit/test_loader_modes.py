"""Padded (unpacked) micro-batches, documents split at max_seq_len, prefetching, and
tokenisation on worker processes."""

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR
from tuneforge.data.bin_packing import padded_groups
from tuneforge.data.chat import Rendering, tokenize_conversations
from tuneforge.data.dataset import build_examples, report_left_out
from tuneforge.data.packing import IGNORE_INDEX, PAD_TOKEN, PackedLoader, make_example
from tuneforge.data.parallel import tokenize_all
from tuneforge.data.reading import read_conversations
from tuneforge.data.records import Conversation, DataError


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)


def examples_of_lengths(lengths):
    return [make_example(list(range(1, n + 1)), [True] * n) for n in lengths]


def test_padded_groups_hold_every_document_once_within_the_budget():
    lengths = np.random.default_rng(0).integers(1, 60, 400).tolist()
    groups = padded_groups(lengths, 128, seed=3)
    assert sorted(i for g in groups for i in g) == list(range(400))
    assert all(max(lengths[i] for i in g) * len(g) <= 128 for g in groups)
    assert groups == padded_groups(lengths, 128, seed=3) != padded_groups(lengths, 128, seed=4)


def test_padded_batches_pad_each_row_to_the_longest_without_loss_on_padding():
    examples = examples_of_lengths([3, 7, 5, 2, 6, 4])
    loader = PackedLoader(examples, 24, seed=0, strategy="none")
    seen = []
    for index in range(len(loader.bins)):
        batch = loader.batch(index)
        documents = [examples[i] for i in loader.bins[index]]
        width = max(len(ex.input_ids) for ex in documents)
        rows = batch.tokens.view(len(documents), width)
        labels = batch.labels.view(len(documents), width)
        for row, row_labels, example in zip(rows, labels, documents, strict=True):
            n = len(example.input_ids)
            assert row[:n].tolist() == example.input_ids and (row[n:] == PAD_TOKEN).all()
            assert row_labels[:n].tolist() == example.labels and (row_labels[n:] == -100).all()
        assert batch.num_padding == width * len(documents) - sum(
            len(ex.input_ids) for ex in documents
        )
        assert batch.packed.cu_seqlens.tolist() == list(range(0, width * len(documents) + 1, width))
        seen += loader.bins[index]
    assert sorted(seen) == list(range(len(examples)))


def test_the_loader_state_counts_batches_handed_out_not_prefetched():
    examples = examples_of_lengths([(7 * i) % 31 + 2 for i in range(120)])
    stream = iter(PackedLoader(examples, 40, 5))
    reference = [next(stream).tokens.tolist() for _ in range(80)]
    loader = PackedLoader(examples, 40, 5, prefetch=6)
    stream = iter(loader)
    taken = [next(stream).tokens.tolist() for _ in range(len(loader) + 2)]
    assert loader.state_dict() == {"epoch": 1, "position": 2, "seed": 5, "balance": 0}
    resumed = PackedLoader(examples, 40, 5, prefetch=1)
    resumed.load_state_dict(loader.state_dict())
    stream = iter(resumed)
    taken += [next(stream).tokens.tolist() for _ in range(80 - len(taken))]
    assert taken == reference


def test_split_long_cuts_documents_into_pieces_that_keep_every_target(tokenizer):
    text = Conversation([], "t:1", text=" ".join(f"w{i}" for i in range(200)))
    (whole,) = tokenize_conversations(tokenizer, [text], Rendering("all"))
    examples, stats = build_examples(
        [text], tokenizer, 32, "drop", Rendering("all"), split_long=True
    )
    assert stats.num_split == 1 and stats.num_dropped_too_long == 0
    assert all(len(ex.input_ids) <= 32 for ex in examples) and len(examples) > 1
    assert [t for ex in examples for t in ex.input_ids] == whole.input_ids
    # the last token of each piece still predicts the next piece's first token
    reference = make_example(whole.input_ids, whole.loss_mask)
    assert [label for ex in examples for label in ex.labels] == reference.labels
    assert examples[0].labels[-1] == whole.input_ids[32] != IGNORE_INDEX
    assert stats.num_loss_tokens == len(whole.input_ids) - 1


def test_split_long_is_off_by_default_and_what_is_dropped_is_said(tokenizer, caplog):
    text = Conversation([], "t:1", text=" ".join(f"w{i}" for i in range(200)))
    short = Conversation([], "t:2", text="w1 w2")
    with caplog.at_level("WARNING"):
        examples, stats = build_examples([text, short], tokenizer, 32, "drop", Rendering("all"))
        report_left_out(stats, 32)
    assert stats.num_dropped_too_long == 1 and len(examples) == 1
    assert "1 of 2 record(s) are longer than data.max_seq_len=32: 0 truncated, 1 dropped" in (
        caplog.text
    )


def test_worker_processes_tokenise_exactly_like_this_process(tmp_path, tokenizer):
    lines = (DEMO_DATA_DIR / "train.jsonl").read_text().splitlines()[:4500]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    conversations, _ = read_conversations(tmp_path / "d.jsonl", "openai")
    tokenizer.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ")
    here = list(tokenize_all(tokenizer, conversations, Rendering("last_assistant"), workers=0))
    spread = list(tokenize_all(tokenizer, conversations, Rendering("last_assistant"), workers=2))
    assert len(spread) == len(conversations) == 4500
    assert [r.input_ids for r in spread] == [r.input_ids for r in here]
    assert [r.loss_mask for r in spread] == [r.loss_mask for r in here]


def test_inspect_reports_what_packing_none_would_waste(tmp_path, tokenizer):
    from tuneforge.config.sections.data import DataSection, DataSource
    from tuneforge.data.report import inspect_data

    records = [
        {"messages": [{"role": "user", "content": "x " * n}, {"role": "assistant", "content": "y"}]}
        for n in (1, 50, 3, 90, 2, 40)
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = DataSection(train=[DataSource(path=tmp_path / "d.jsonl")], max_seq_len=256)
    report = inspect_data(data, tokenizer, 256)
    loader_examples, _ = build_examples(
        read_conversations(tmp_path / "d.jsonl", "openai")[0], tokenizer, 256, "drop", Rendering()
    )
    loader = PackedLoader(loader_examples, 256, seed=0, strategy="none")
    real = sum(len(ex.input_ids) for ex in loader_examples)
    computed = sum(loader.batch(i).tokens.numel() for i in range(len(loader.bins)))
    assert report.padding_waste == pytest.approx(1 - real / computed)


def slowest(loaders, costs):
    """The epoch's steps' costliest micro-batch, summed: what the ranks wait for."""
    per_step = zip(*(loader.epoch_order(0) for loader in loaders), strict=True)
    return sum(max(costs[i] for i in step) for step in per_step)


def test_balanced_ranks_get_similar_attention_work_and_every_bin_once():
    """Two and four ranks with balance: every bin once per epoch over the ranks; each step's
    costliest micro-batch costs less summed over the epoch than without balance (sorted
    neighbours per window are the least such sum); the order is the seed's, so a loader resumed
    from its state hands out the same batches."""
    from tuneforge.data.rank_balance import attention_cost

    lengths = [
        int(x) for x in np.random.default_rng(3).lognormal(np.log(60), 0.9, 600).clip(4, 400)
    ]
    examples = examples_of_lengths(lengths)
    for world_size in (2, 4):
        plain = [
            PackedLoader(examples, 400, 7, rank=r, world_size=world_size) for r in range(world_size)
        ]
        balanced = [PackedLoader(examples, 400, 7, rank=r, world_size=world_size, balance=True)
                    for r in range(world_size)]  # fmt: skip
        costs = [attention_cost([lengths[i] for i in bin_]) for bin_ in plain[0].bins]
        orders = [loader.epoch_order(0) for loader in balanced]
        assert sorted(i for order in orders for i in order) == sorted(
            i for loader in plain for i in loader.epoch_order(0)
        )

        assert slowest(balanced, costs) < 0.9 * slowest(plain, costs)
        assert balanced[0].epoch_order(1) != orders[0]  # a new deal every epoch

    loader = PackedLoader(examples, 400, 7, rank=1, world_size=2, balance=True)
    stream = iter(loader)
    taken = [next(stream).tokens.tolist() for _ in range(5)]
    resumed = PackedLoader(examples, 400, 7, rank=1, world_size=2, balance=True)
    resumed.load_state_dict(loader.state_dict())
    reference = iter(PackedLoader(examples, 400, 7, rank=1, world_size=2, balance=True))
    expected = [next(reference).tokens.tolist() for _ in range(8)]
    assert [*taken, next(iter(resumed)).tokens.tolist()] == expected[:6]
    with pytest.raises(DataError, match="balance_ranks"):
        PackedLoader(examples, 400, 7, rank=1, world_size=2).load_state_dict(loader.state_dict())
