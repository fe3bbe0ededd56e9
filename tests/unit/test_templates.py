"""Loss masks token by token with built-in templates on locally built tokenizers."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tuneforge.data.chat import tokenize_conversation
from tuneforge.data.records import Conversation
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
    tokenized = tokenize_conversation(tokenizer, conversation, train_on)
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
        "Blue.<|im_end|>\n",
        "Green, of course.<|im_end|>\n",
    ]
    tokenized = tokenize_conversation(tokenizer, CONVERSATION, "all")
    assert all(tokenized.loss_mask)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("alpaca", ["Blue.<|endoftext|>\n\n", "Green, of course.<|endoftext|>\n\n"]),
        ("squad", ["Blue.<|endoftext|>\n\n", "Green, of course.<|endoftext|>\n\n"]),
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
    tokenized = tokenize(tokenizer, Conversation([], "t:1", text="Blue and green."), "assistant")
    assert all(tokenized.loss_mask)
    assert tokenizer.decode(tokenized.input_ids) == "Blue and green.<|endoftext|>"
