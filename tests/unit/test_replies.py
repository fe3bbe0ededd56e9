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


def test_prompts_training_would_refuse_are_all_named_and_nothing_is_left_behind(tmp_path):
    """Two user turns in a row, empty or missing content, a missing role, list or number
    content: each line named, in one error, before any model loads."""
    lines = [
        '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}',
        '{"messages": [{"role": "user", "content": ""}]}',
        '{"messages": [{"role": "user"}]}',
        '{"messages": [{"content": "hi"}]}',
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}',
        '{"messages": [{"role": "user", "content": 7}]}',
        '{"prompt": ""}',
        '{"prompt": 3}',
        '{"prompt": "fine"}',
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as raised:
        read_prompts(bad)
    said = str(raised.value)
    assert "8 bad prompt record(s)" in said
    for number, expected in enumerate(
        ["role 'user' cannot come after 'user'", "content is empty", "content must be a string",
         "role is None", "content must be a string", "content must be a string",
         '"prompt" is empty', '"prompt" must be a string, not int'],
        start=1,
    ):  # fmt: skip
        assert f"bad.jsonl:{number}: " in said and expected in said, expected
    assert "bad.jsonl:9" not in said


def test_a_seed_gives_each_prompt_the_same_sample_at_any_batch_size(tmp_path, model_dir):
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    conversations = [[{"role": "user", "content": f"sort: {i} 3 1"}] for i in range(5)]
    written = {}
    for size in (1, 2, 5):
        out = tmp_path / f"b{size}.jsonl"
        write_replies(
            model, tokenizer, conversations, out, batch_size=size, max_new_tokens=8,
            temperature=1.0, seed=3,
        )  # fmt: skip
        written[size] = out.read_text()
    assert written[1] == written[2] == written[5]
    other = tmp_path / "seed4.jsonl"
    write_replies(
        model, tokenizer, conversations, other, batch_size=5, max_new_tokens=8, temperature=1.0,
        seed=4,
    )  # fmt: skip
    assert other.read_text() != written[5]


def test_empty_replies_are_left_out_of_the_written_data(tmp_path, model_dir, monkeypatch, caplog):
    model, tokenizer = load_trained(model_dir, torch.device("cpu"))
    monkeypatch.setattr(
        "tuneforge.inference.replies.generate",
        lambda model, prompts, *args: [[] if i % 2 else [5, 6] for i in range(len(prompts))],
    )
    conversations = [[{"role": "user", "content": f"max: {i} 2"}] for i in range(4)]
    out = tmp_path / "replies.jsonl"
    count = write_replies(
        model, tokenizer, conversations, out, batch_size=4, max_new_tokens=4, temperature=0.0,
        seed=0,
    )  # fmt: skip
    assert count == 2 and len(out.read_text().splitlines()) == 2
    assert "2 of 4 prompts got an empty reply" in caplog.text


def test_a_model_without_a_chat_template_and_an_empty_prompt_are_refused(tmp_path, model_dir):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(model_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    from tuneforge.errors import TuneforgeError

    with pytest.raises(TuneforgeError, match="has no chat template"):
        load_trained(plain, torch.device("cpu"))
    result = run_cli("generate", str(model_dir), "--prompt", " ")
    assert_clean_failure(result, "--prompt is empty")


def test_a_run_whose_training_data_moved_still_generates(tmp_path):
    """chat and generate need the model, the adapter and the tokenizer, not the data."""
    from tests.helpers import QUIET_DEMO

    run = tmp_path / "run"
    data = tmp_path / "train.jsonl"
    from tuneforge.assets import DEMO_DATA_DIR

    data.write_text("".join((DEMO_DATA_DIR / "train.jsonl").read_text().splitlines(True)[:64]))
    overrides = [f"data.train=[{{path: {data}}}]", f"run.output_dir={run}", *QUIET_DEMO]
    result = run_cli("train", "examples/demo.yaml", "train.max_steps=2", *overrides)
    assert result.returncode == 0, result.stderr[-2000:]
    data.unlink()
    model, tokenizer = load_trained(run, torch.device("cpu"))
    assert tokenizer.chat_template and model.args.num_layers == 4
