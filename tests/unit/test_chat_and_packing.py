import pytest
import torch
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.data.bin_packing import first_fit_decreasing
from tuneforge.data.chat import Rendering, tokenize_conversation
from tuneforge.data.packing import IGNORE_INDEX, PackedLoader, collate, make_example
from tuneforge.data.records import Conversation


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)


def trained_text(tokenizer, conversation, train_on="assistant"):
    tokenized = tokenize_conversation(tokenizer, conversation, Rendering(train_on))
    return tokenizer.decode(
        [t for t, m in zip(tokenized.input_ids, tokenized.loss_mask, strict=True) if m]
    )


def test_only_assistant_replies_and_their_end_of_turn_carry_loss(tokenizer):
    conversation = Conversation(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "reverse: a b"},
            {"role": "assistant", "content": "b a"},
            {"role": "user", "content": "upper: c"},
            {"role": "assistant", "content": "C"},
        ],
        "test:1",
    )
    # the newline the template writes after <|im_end|> is not the reply's: generation stops before
    assert trained_text(tokenizer, conversation) == "b a<|im_end|>C<|im_end|>"
    full = tokenizer.apply_chat_template(conversation.messages, tokenize=False)
    assert trained_text(tokenizer, conversation, "all") == full


def test_labels_are_shifted_inside_each_document_and_never_cross():
    first = make_example([1, 2, 3, 4], [False, False, True, True])
    second = make_example([5, 6, 7], [False, True, True])
    assert first.labels == [IGNORE_INDEX, 3, 4, IGNORE_INDEX]
    assert second.labels == [6, 7, IGNORE_INDEX]
    batch = collate([first, second])
    assert batch.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7]
    # the last token of the first document never predicts the first token of the second
    assert batch.labels[3] == IGNORE_INDEX
    assert batch.packed.cu_seqlens.tolist() == [0, 4, 7]
    assert batch.packed.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert batch.num_loss_tokens == 4


def test_first_fit_decreasing_respects_the_budget_and_keeps_every_example():
    lengths = [
        int(x) for x in torch.randint(1, 50, (500,), generator=torch.Generator().manual_seed(0))
    ]
    bins = first_fit_decreasing(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    lower_bound = -(-sum(lengths) // 64)
    assert len(bins) <= lower_bound * 1.05 + 1
    assert bins == first_fit_decreasing(lengths, 64)


def test_loader_reshuffles_bins_each_epoch_deterministically():
    examples = [make_example(list(range(n)), [True] * n) for n in range(2, 40)]
    loader = PackedLoader(examples, 48, seed=3)
    assert loader.epoch_order(0) != loader.epoch_order(1)
    assert loader.epoch_order(1) == PackedLoader(examples, 48, seed=3).epoch_order(1)
    iterator = iter(loader)
    epoch_tokens = [next(iterator).tokens.numel() for _ in range(len(loader))]
    assert sum(epoch_tokens) == sum(len(ex.input_ids) for ex in examples)


def examples_of_lengths(lengths):
    return [make_example(list(range(n)), [True] * n) for n in lengths]


def test_loader_resumes_mid_epoch_with_exactly_the_remaining_sequence():
    examples = examples_of_lengths([(7 * i) % 31 + 2 for i in range(120)])
    reference = PackedLoader(examples, 40, seed=5)
    stream = iter(reference)
    expected = [next(stream).tokens.tolist() for _ in range(3 * len(reference))]
    interrupted = PackedLoader(examples, 40, seed=5)
    stream = iter(interrupted)
    seen = [next(stream).tokens.tolist() for _ in range(len(reference) + 4)]
    resumed = PackedLoader(examples, 40, seed=5)
    resumed.load_state_dict(interrupted.state_dict())
    stream = iter(resumed)
    seen += [next(stream).tokens.tolist() for _ in range(len(expected) - len(seen))]
    assert seen == expected


def test_two_ranks_see_disjoint_bins_and_the_same_number_of_steps():
    examples = examples_of_lengths([(5 * i) % 23 + 1 for i in range(101)])
    ranks = [PackedLoader(examples, 30, seed=1, rank=r, world_size=2) for r in range(2)]
    for epoch in range(3):
        first, second = (set(loader.epoch_order(epoch)) for loader in ranks)
        assert not first & second
        assert len(first) == len(second) == len(ranks[0])
        assert len(ranks[0].bins) - len(first | second) == len(ranks[0].bins) % 2
