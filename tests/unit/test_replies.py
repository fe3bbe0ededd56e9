"""Answering a file of prompts: each conversation gets the reply `generate` gives it alone (in
batches, greedy), written as openai messages in order; prompts come as {prompt} or {messages}
(a final assistant turn answered anew); a bad line names its file and line."""

import json

import pytest
import torch

from tests.cli_runs import assert_clean_failure, run_cli
from tests.helpers import save_tiny_chat_model
from tuneforge.data.records import DataError
from tuneforge.inference.replies import read_prompts, write_replies
from tuneforge.inference.trained import load_trained
from tuneforge.models.generate import generate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("model"))


def test_a_file_of_prompts_gets_the_replies_each_gets_alone(tmp_path, model_dir):
    prompts = tmp_path / "prompts.jsonl"
    chat = [{"role": "user", "content": "max: 4 8 2"}, {"role": "assistant", "content": "8"}]
    lines = [{"prompt": "sort: 7 3 9 1"}, {"messages": chat}, {"prompt": "add: 2 + 2"}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    conversations = read_prompts(prompts)
    assert conversations[1] == chat[:1]
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    out = tmp_path / "replies.jsonl"
    count = write_replies(
        model, tokenizer, conversations, out, batch_size=2, max_new_tokens=6, temperature=0.0,
        seed=0,
    )  # fmt: skip
    written = [json.loads(line)["messages"] for line in out.read_text().splitlines()]
    assert count == len(written) == 3 and not out.with_name("replies.jsonl.partial").exists()
    for messages, conversation in zip(written, conversations, strict=True):
        assert messages[:-1] == conversation and messages[-1]["role"] == "assistant"
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        alone = generate(model, [ids], 6, {tokenizer.eos_token_id})[0]
        assert messages[-1]["content"] == tokenizer.decode(alone, skip_special_tokens=True)


def test_bad_prompts_and_an_existing_output_are_refused_cleanly(tmp_path, model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: needs"):
        read_prompts(bad)
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    result = run_cli("generate", str(model_dir), "--data", str(bad), "--out", str(out))
    assert_clean_failure(result, "exists: choose another file, or add --overwrite")
    assert out.read_text() == "kept\n"
    result = run_cli(
        "generate", str(model_dir), "--data", str(bad), "--out", str(tmp_path / "n.jsonl")
    )
    assert_clean_failure(result, "bad.jsonl:2: needs")
