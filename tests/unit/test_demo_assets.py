"""The bundled demo assets are what the script in the repository makes."""

import json

from transformers import AutoTokenizer

from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR
from tuneforge.assets.build_demo import make_records
from tuneforge.models.catalog import CATALOG


def read_jsonl(file):
    return [json.loads(line) for line in file.read_text().splitlines()]


def test_bundled_data_is_reproduced_by_the_generator():
    train, evaluation = make_records()
    assert read_jsonl(DEMO_DATA_DIR / "train.jsonl") == train
    assert read_jsonl(DEMO_DATA_DIR / "eval.jsonl") == evaluation


def test_held_out_prompts_never_appear_in_training():
    train_prompts = {r["messages"][0]["content"] for r in read_jsonl(DEMO_DATA_DIR / "train.jsonl")}
    eval_prompts = {r["messages"][0]["content"] for r in read_jsonl(DEMO_DATA_DIR / "eval.jsonl")}
    assert eval_prompts and not eval_prompts & train_prompts


def test_demo_tokenizer_loads_with_auto_tokenizer_and_fits_the_demo_model():
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    assert tokenizer.eos_token == "<|im_end|>"
    messages = [
        {"role": "user", "content": "reverse: a b"},
        {"role": "assistant", "content": "b a"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert (
        text == "<|im_start|>user\nreverse: a b<|im_end|>\n<|im_start|>assistant\nb a<|im_end|>\n"
    )
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer) <= CATALOG["demo-tiny"].vocab_size
