"""Exact-match accuracy of greedy replies over held-out data that mixes chat and raw text."""

import torch
from transformers import AutoTokenizer

import tuneforge
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.data.records import Conversation
from tuneforge.train.evaluate import exact_match


def test_raw_text_is_left_out_and_each_reply_is_shown_with_its_last_question():
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    torch.manual_seed(0)
    model = tuneforge.load_model("demo-tiny", dtype="float32", num_layers=1)
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "b"},
    ]
    conversations = [
        Conversation([], "held.jsonl:1", text="raw text has no reply"),
        Conversation(chat, "held.jsonl:2"),
        Conversation(chat[:3], "held.jsonl:3"),
    ]
    result = exact_match(model, tokenizer, conversations, max_new_tokens=3)
    assert result.num_total == 2
    assert [(prompt, expected) for prompt, expected, _ in result.examples] == [
        ("second question", "b"),
        ("first question", "a"),
    ]
