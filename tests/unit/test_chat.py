"""`tuneforge chat`: the streamed tokens are `generate`'s, each turn answers the whole
conversation as the chat template renders it, /reset starts over, and the command reads turns
from its input."""

import subprocess
import sys

import pytest
import torch

from tests.cli_runs import REPO
from tests.helpers import save_tiny_chat_model
from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.inference.chat import chat
from tuneforge.inference.trained import load_trained
from tuneforge.models.generate import generate, stream


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("model"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streamed_tokens_are_generates(model_dir, temperature):
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "sort: 3 1 2"}])
    stops = set(stop_ids(tokenizer))
    streamed = list(stream(model, ids, 12, stops, temperature, torch.Generator().manual_seed(5)))
    whole = generate(model, [ids], 12, stops, temperature, torch.Generator().manual_seed(5))[0]
    assert streamed == whole and streamed


def test_each_turn_answers_the_whole_conversation_and_reset_starts_over(model_dir):
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    shown: list[str] = []
    lines = ["add: 2 + 2\n", "max: 4 8 2\n", "/reset\n", "min: 5 3\n", "/exit\n", "unseen\n"]
    messages = chat(model, tokenizer, lines, shown.append, "Be brief.", max_new_tokens=8)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"] == "min: 5 3"
    stops = set(stop_ids(tokenizer))
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add: 2 + 2"}]
    reply = tokenizer.decode(
        generate(model, [prompt_ids(tokenizer, first)], 8, stops)[0], skip_special_tokens=True
    )
    second = [*first, {"role": "assistant", "content": reply},
              {"role": "user", "content": "max: 4 8 2"}]  # fmt: skip
    answer = tokenizer.decode(
        generate(model, [prompt_ids(tokenizer, second)], 8, stops)[0], skip_special_tokens=True
    )
    text = "".join(shown)
    assert text.startswith(f"{reply}\n{answer}\n(a new conversation)\n")
    assert text == f"{reply}\n{answer}\n(a new conversation)\n{messages[2]['content']}\n"


def test_the_command_reads_turns_from_its_input(model_dir):
    result = subprocess.run(
        [sys.executable, "-m", "tuneforge", "chat", str(model_dir), "--max-new-tokens", "4"],
        input="add: 1 + 1\n", capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "add: 1 + 1"}])
    reply = generate(model, [ids], 4, set(stop_ids(tokenizer)))[0]
    assert result.stdout == tokenizer.decode(reply, skip_special_tokens=True) + "\n"


def test_empty_lines_unknown_commands_and_overlong_turns_do_not_reach_the_model(model_dir):
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    shown: list[str] = []
    context = model.args.max_position_embeddings
    lines = ["", "/help", "/unknown thing", "x " * context, "add: 1 + 1"]
    messages = chat(model, tokenizer, lines, shown.append, max_new_tokens=4, reply_prefix="model> ")
    text = "".join(shown)
    assert text.count("model> ") == 1  # only the one turn the model answers
    assert "(unknown command /help: /reset" in text and "(unknown command /unknown:" in text
    assert f"beyond the model's context of {context}" in text
    assert [m["content"] for m in messages if m["role"] == "user"] == ["add: 1 + 1"]
