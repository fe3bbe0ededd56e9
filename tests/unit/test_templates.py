"""Loss masks token by token with built-in templates on locally built tokenizers."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.data.chat import Rendering, tokenize_conversation
from tuneforge.data.dataset import build_examples
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.templates import BUILTIN_TEMPLATES, resolve_template

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONVERSATION = Conversation(
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green, of course."},
    ],
    "test:1",
)


def local_tokenizer(
    specials: list[str], bos: str | None, eos: str, template: str
) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [m["content"] for m in CONVERSATION.messages] + [
        "system user assistant Instruction Response Answer"
    ]
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=eos)
    fast.chat_template = resolve_template(template)
    return fast


def trained_pieces(tokenizer, conversation, train_on="assistant") -> list[str]:
    tokenized = tokenize_conversation(tokenizer, conversation, Rendering(train_on))
    pieces, current = [], []
    for token, trained in zip(tokenized.input_ids, tokenized.loss_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            pieces.append(tokenizer.decode(current))
            current = []
    if current:
        pieces.append(tokenizer.decode(current))
    return pieces


def test_llama3_template_trains_each_reply_and_its_eot():
    tokenizer = local_tokenizer(LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", "llama3")
    text = tokenizer.apply_chat_template(CONVERSATION.messages, tokenize=False)
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
    )
    assert trained_pieces(tokenizer, CONVERSATION) == [
        "Blue.<|eot_id|>",
        "Green, of course.<|eot_id|>",
    ]
    assert trained_pieces(tokenizer, CONVERSATION, "last_assistant") == [
        "Green, of course.<|eot_id|>"
    ]


def test_chatml_template_trains_each_reply_and_its_end_of_turn():
    tokenizer = local_tokenizer(CHATML_SPECIALS, None, "<|im_end|>", "chatml")
    assert trained_pieces(tokenizer, CONVERSATION) == [
        "Blue.<|im_end|>",
        "Green, of course.<|im_end|>",
    ]
    tokenized = tokenize_conversation(tokenizer, CONVERSATION, Rendering("all"))
    assert all(tokenized.loss_mask)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("alpaca", ["Blue.<|endoftext|>", "Green, of course.<|endoftext|>"]),
        ("squad", ["Blue.<|endoftext|>", "Green, of course.<|endoftext|>"]),
    ],
)
def test_prompt_style_templates(template, expected):
    tokenizer = local_tokenizer(CHATML_SPECIALS, None, "<|endoftext|>", template)
    assert trained_pieces(tokenizer, CONVERSATION) == expected


def test_every_builtin_template_renders_incrementally():
    tokenizer = local_tokenizer(
        LLAMA3_SPECIALS + CHATML_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", "chatml"
    )
    for name in BUILTIN_TEMPLATES:
        tokenizer.chat_template = resolve_template(name)
        assert trained_pieces(tokenizer, CONVERSATION), name


def test_raw_text_is_trained_entirely_and_ends_with_eos():
    from tuneforge.data.chat import tokenize_conversation as tokenize

    tokenizer = local_tokenizer(CHATML_SPECIALS, None, "<|endoftext|>", "chatml")
    tokenized = tokenize(tokenizer, Conversation([], "t:1", text="Blue and green."), Rendering())
    assert all(tokenized.loss_mask)
    assert tokenizer.decode(tokenized.input_ids) == "Blue and green.<|endoftext|>"


TEMPLATES = Path(__file__).resolve().parents[1] / "assets" / "templates"


def official(name: str, specials: list[str], bos: str | None, eos: str):
    """A tokenizer carrying a family's official chat template, as its tokenizer_config holds it."""
    return local_tokenizer(specials, bos, eos, (TEMPLATES / f"{name}.jinja").read_text())


def test_qwen3_official_template_trains_every_reply_of_a_multi_turn_conversation():
    """Qwen3's template drops earlier replies' reasoning and writes an empty think block into
    the last reply only: each reply is trained as the full conversation renders it."""
    tokenizer = official("qwen3", CHATML_SPECIALS, None, "<|im_end|>")
    thinking = Conversation(
        [
            *CONVERSATION.messages[:2],
            {"role": "assistant", "content": "<think>\nsky\n</think>\n\nBlue."},
            *CONVERSATION.messages[3:],
        ],
        "test:2",
    )
    assert trained_pieces(tokenizer, CONVERSATION) == [
        "Blue.<|im_end|>",
        "<think>\n\n</think>\n\nGreen, of course.<|im_end|>",
    ]
    assert trained_pieces(tokenizer, thinking) == [
        "Blue.<|im_end|>",  # earlier reasoning is not rendered, so not trained
        "<think>\n\n</think>\n\nGreen, of course.<|im_end|>",
    ]
    masked = tokenize_conversation(tokenizer, CONVERSATION, Rendering(empty_think="mask"))
    trained = [t for t, m in zip(masked.input_ids, masked.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == "Blue.<|im_end|>Green, of course.<|im_end|>"
    rendered = tokenizer.apply_chat_template(CONVERSATION.messages, tokenize=False)
    assert tokenizer.decode(masked.input_ids) == rendered  # masked, still in the input


def test_llama3_2_official_template_writes_a_fixed_date():
    tokenizer = official("llama3_2", LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>")
    rendering = Rendering.of(DataSection(train=[DataSource(path=TEMPLATES)]))
    tokenized = tokenize_conversation(tokenizer, CONVERSATION, rendering)
    assert "Today Date: 26 Jul 2024\n\nYou are terse." in tokenizer.decode(tokenized.input_ids)
    assert trained_pieces(tokenizer, CONVERSATION) == [
        "Blue.<|eot_id|>",
        "Green, of course.<|eot_id|>",
    ]


def test_a_conversation_the_template_refuses_is_named_or_skipped():
    tokenizer = official("llama3_2", LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>")
    two_calls = {"name": "f", "arguments": {}}
    bad = Conversation(
        [
            {"role": "user", "content": "call twice"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": two_calls}, {"function": two_calls}],
            },
        ],
        "bad.jsonl:7",
    )
    with pytest.raises(DataError, match=r"bad.jsonl:7: the chat template cannot render.*single"):
        build_examples([CONVERSATION, bad], tokenizer, 512, "drop", Rendering())
    examples, stats = build_examples(
        [CONVERSATION, bad], tokenizer, 512, "drop", Rendering(), on_bad_record="skip"
    )
    assert len(examples) == 1 and stats.num_unrenderable == 1


def test_gemma3_official_template_trains_each_model_turn_and_its_end_of_turn():
    """Gemma 3 folds the system message into the first user turn and calls the assistant
    `model`; each reply is trained with its `<end_of_turn>`, which generation stops at."""
    from tuneforge.export.generation import end_of_turn_id

    specials = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tokenizer = official("gemma3", specials, "<bos>", "<eos>")
    text = tokenizer.apply_chat_template(CONVERSATION.messages, tokenize=False)
    assert text.startswith(
        "<bos><start_of_turn>user\nYou are terse.\n\nName a colour.<end_of_turn>"
    )
    assert trained_pieces(tokenizer, CONVERSATION) == [
        "Blue.<end_of_turn>",
        "Green, of course.<end_of_turn>",
    ]
    assert end_of_turn_id(tokenizer) == tokenizer.convert_tokens_to_ids("<end_of_turn>")
