"""Record formats and sources, and a battery of malformed inputs that must each fail clearly."""

import json

import pytest

from tuneforge.data.reading import read_conversations
from tuneforge.data.records import DataError

USER_ASSISTANT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_alpaca_with_input_and_system(tmp_path):
    file = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"instruction": "Translate", "input": "chat", "output": "cat", "system": "be exact"},
            {"instruction": "Count to 3", "input": "", "output": "1 2 3"},
        ],
    )
    (first, second), bad = read_conversations(file, "alpaca")
    assert first.messages == [
        {"role": "system", "content": "be exact"},
        {"role": "user", "content": "Translate\n\nchat"},
        {"role": "assistant", "content": "cat"},
    ]
    assert second.messages[0] == {"role": "user", "content": "Count to 3"}
    assert bad.count == 0 and first.origin == f"{file}:1"


def test_squad_takes_the_first_answer(tmp_path):
    file = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {
                "context": "Paris is in France.",
                "question": "Where is Paris?",
                "answers": {"text": ["France", "FR"]},
            }
        ],
    )
    ((conversation,), _) = read_conversations(file, "squad")
    assert (
        conversation.messages[0]["content"]
        == "Context: Paris is in France.\n\nQuestion: Where is Paris?"
    )
    assert conversation.messages[1] == {"role": "assistant", "content": "France"}


def test_sharegpt_roles_are_mapped(tmp_path):
    turns = [
        {"from": "system", "value": "s"},
        {"from": "human", "value": "h"},
        {"from": "gpt", "value": "g"},
        {"from": "human", "value": "h2"},
        {"from": "gpt", "value": "g2"},
    ]
    file = write_jsonl(tmp_path / "g.jsonl", [{"conversations": turns}])
    ((conversation,), _) = read_conversations(file, "sharegpt")
    assert [m["role"] for m in conversation.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def test_text_and_field_map(tmp_path):
    file = write_jsonl(tmp_path / "t.jsonl", [{"body": "plain text"}])
    ((conversation,), _) = read_conversations(file, "text", {"text": "body"})
    assert conversation.text == "plain text" and conversation.messages == []


def test_a_records_other_fields_are_kept_beside_it(tmp_path):
    """What the format does not read (under its mapped name too) stays with the record, for
    reward functions; a record without others keeps none."""
    records = [
        {"messages": USER_ASSISTANT, "solution": "a", "tests": [1, 2]},
        {"messages": USER_ASSISTANT},
    ]
    found, _ = read_conversations(write_jsonl(tmp_path / "m.jsonl", records), "openai")
    assert [c.fields for c in found] == [{"solution": "a", "tests": [1, 2]}, None]
    alpaca = {"q": "question", "output": "a", "level": 3}
    ((conversation,), _) = read_conversations(
        write_jsonl(tmp_path / "a.jsonl", [alpaca]), "alpaca", {"instruction": "q"}
    )
    assert conversation.fields == {"level": 3}


def test_a_prompt_alone_is_read_for_sampling_and_kept_only_there(tmp_path):
    """Format `prompt`: a string or messages ending with the user's turn; tokenised with the
    generation prompt and nothing trained, kept where replies are sampled (GRPO) and left out
    of supervised training, which has nothing to learn from it."""
    from transformers import AutoTokenizer

    from tuneforge.assets import DEMO_TOKENIZER_DIR
    from tuneforge.data.chat import Rendering, prompt_ids
    from tuneforge.data.dataset import build_examples

    records = [{"prompt": "sort: 3 1", "solution": "1 3"}, {"prompt": USER_ASSISTANT[:1]}]
    found, _ = read_conversations(write_jsonl(tmp_path / "p.jsonl", records), "prompt")
    assert [c.is_prompt for c in found] == [True, True]
    assert found[0].messages == [{"role": "user", "content": "sort: 3 1"}]
    assert [c.fields for c in found] == [{"solution": "1 3"}, None]
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    sampled, _ = build_examples(found, tokenizer, 64, "drop", Rendering(), keep_fields=True)
    assert [e.input_ids for e in sampled] == [prompt_ids(tokenizer, c.messages) for c in found]
    assert all(set(e.labels) == {-100} for e in sampled)
    with pytest.raises(
        DataError, match=r"no trainable examples.*they are for train\.objective grpo"
    ):
        build_examples(found, tokenizer, 64, "drop", Rendering())
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": USER_ASSISTANT}])
    with pytest.raises(DataError, match=r'bad\.jsonl:1: field "prompt": a prompt must end'):
        read_conversations(bad, "prompt")


def test_tool_turns_follow_the_assistant(tmp_path):
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "call weather()"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    file = write_jsonl(tmp_path / "m.jsonl", [{"messages": messages}])
    ((conversation,), _) = read_conversations(file, "messages")
    assert conversation.messages == messages


def test_json_list_parquet_directory_and_glob(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "one.json").write_text(json.dumps([{"messages": USER_ASSISTANT}] * 2))
    write_jsonl(tmp_path / "d" / "two.jsonl", [{"messages": USER_ASSISTANT}])
    found, _ = read_conversations(tmp_path / "d", "openai")
    assert [c.origin.rsplit("/", 1)[1] for c in found] == [
        "one.json[0]",
        "one.json[1]",
        "two.jsonl:1",
    ]
    assert len(read_conversations(tmp_path / "d" / "*.jsonl", "openai")[0]) == 1
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pyarrow.Table.from_pylist([{"instruction": "i", "output": "o"}]), tmp_path / "p.parquet"
    )
    ((conversation,), _) = read_conversations(tmp_path / "p.parquet", "alpaca")
    assert conversation.origin.endswith("p.parquet row 0")


def test_a_byte_order_mark_is_accepted(tmp_path):
    file = tmp_path / "bom.jsonl"
    file.write_bytes(b"\xef\xbb\xbf" + json.dumps({"messages": USER_ASSISTANT}).encode() + b"\n")
    assert len(read_conversations(file, "openai")[0]) == 1


BAD_LINES = {
    "bad JSON": ("openai", "{not json", "invalid JSON"),
    "truncated JSON": ("openai", '{"messages": [', "invalid JSON"),
    "not an object": ("openai", "[1, 2]", "expected a JSON object, got list"),
    "a bare string": ("openai", '"hello"', "expected a JSON object, got str"),
    "no messages field": ("openai", "{}", 'missing field "messages"'),
    "messages not a list": ("openai", '{"messages": "hi"}', "must be a list"),
    "empty messages": ("openai", '{"messages": []}', "no messages"),
    "message not an object": ("openai", '{"messages": ["hi"]}', "messages[0] is not an object"),
    "unknown role": (
        "openai",
        '{"messages": [{"role": "robot", "content": "x"}]}',
        "role is 'robot'",
    ),
    "content not a string": (
        "openai",
        '{"messages": [{"role": "user", "content": 5}]}',
        "content must be a string",
    ),
    "empty content": (
        "openai",
        '{"messages": [{"role": "user", "content": "  "}]}',
        "content is empty",
    ),
    "no assistant turn": (
        "openai",
        '{"messages": [{"role": "user", "content": "q"}]}',
        "no assistant message",
    ),
    "assistant first": (
        "openai",
        '{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]}',
        "role 'assistant' cannot come first",
    ),
    "two user turns in a row": (
        "openai",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"}, '
        '{"role": "assistant", "content": "a"}]}',
        "role 'user' cannot come after 'user'",
    ),
    "system in the middle": (
        "openai",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, '
        '{"role": "system", "content": "s"}]}',
        "role 'system' cannot come after 'assistant'",
    ),
    "alpaca without output": ("alpaca", '{"instruction": "i"}', 'missing field "output"'),
    "alpaca output not a string": (
        "alpaca",
        '{"instruction": "i", "output": 3}',
        "must be a string, not int",
    ),
    "alpaca empty instruction": (
        "alpaca",
        '{"instruction": "", "output": "o"}',
        'field "instruction" is empty',
    ),
    "squad without answers": (
        "squad",
        '{"context": "c", "question": "q", "answers": []}',
        "at least one answer",
    ),
    "sharegpt unknown speaker": (
        "sharegpt",
        '{"conversations": [{"from": "bot", "value": "x"}]}',
        "from is 'bot'",
    ),
    "sharegpt human twice": (
        "sharegpt",
        '{"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}',
        "conversations[1]: role 'user' cannot come after 'user'",
    ),
    "text without text": ("text", '{"body": "x"}', 'missing field "text"'),
    "null field": ("alpaca", '{"instruction": null, "output": "o"}', 'missing field "instruction"'),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_malformed_record_names_file_line_and_reason(tmp_path, case):
    format_name, line, reason = BAD_LINES[case]
    good = {
        "openai": {"messages": USER_ASSISTANT},
        "alpaca": {"instruction": "i", "output": "o"},
        "squad": {"context": "c", "question": "q", "answers": ["a"]},
        "sharegpt": {
            "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
        },
        "text": {"text": "t"},
    }[format_name]
    file = tmp_path / "data.jsonl"
    file.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(DataError) as raised:
        read_conversations(file, format_name)
    assert f"{file}:2: " in str(raised.value) and reason in str(raised.value)
    kept, bad = read_conversations(file, format_name, on_bad_record="skip")
    assert len(kept) == 1 and bad.count == 1 and reason in bad.reasons[0]


def test_non_utf8_bytes_name_the_line_and_byte(tmp_path):
    file = tmp_path / "latin1.jsonl"
    file.write_bytes(json.dumps({"messages": USER_ASSISTANT}).encode() + b'\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: not valid UTF-8 \(byte 0xe9"):
        read_conversations(file, "text")


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.jsonl", b"", "the file is empty"),
        ("blank.jsonl", b"\n  \n", "the file is empty"),
        ("object.json", b'{"messages": []}', "must hold a list of records"),
        ("broken.json", b'[{"a": 1},\n', "broken.json:2: invalid JSON"),
        ("damaged.parquet", b"PAR1 not really", "damaged.parquet"),
    ],
)
def test_unusable_files_are_clear_errors(tmp_path, name, content, reason):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=reason):
        read_conversations(tmp_path / name, "openai")


def test_missing_files_and_empty_globs(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_conversations(tmp_path / "absent.jsonl", "openai")
    with pytest.raises(DataError, match="no data files"):
        read_conversations(tmp_path / "*.jsonl", "openai")


def test_many_bad_records_are_summarised(tmp_path):
    file = tmp_path / "bad.jsonl"
    file.write_text("{oops\n" * 25)
    with pytest.raises(
        DataError, match=r"25 bad record\(s\)(.|\n)*and 15 more(.|\n)*on_bad_record: skip"
    ):
        read_conversations(file, "openai")


def test_preference_records_train_on_the_chosen_reply(tmp_path):
    file = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
            {
                "prompt": [
                    {"role": "system", "content": "math"},
                    {"role": "user", "content": "3+3?"},
                ],
                "chosen": [
                    {"role": "user", "content": "3+3?"},
                    {"role": "assistant", "content": "6"},
                ],
                "rejected": "7",
            },
        ],
    )
    (first, second), _ = read_conversations(file, "preference")
    assert first.messages == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert first.rejected == "5"
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant"]
    assert second.messages[-1]["content"] == "6" and second.rejected == "7"
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "q", "chosen": "a"}) + "\n")
    with pytest.raises(DataError, match=r'bad\.jsonl:1: missing field "rejected"'):
        read_conversations(tmp_path / "bad.jsonl", "preference")


def test_unpaired_records_carry_their_label_and_a_missing_or_odd_label_fails(tmp_path):
    file = write_jsonl(
        tmp_path / "u.jsonl",
        [
            {"prompt": "2+2?", "completion": "4", "label": True},
            {"prompt": [{"role": "user", "content": "3+3?"}], "completion": "7", "label": False},
        ],
    )
    (first, second), _ = read_conversations(file, "unpaired")
    assert first.messages[-1] == {"role": "assistant", "content": "4"} and first.desirable
    assert second.messages[0] == {"role": "user", "content": "3+3?"}
    assert second.desirable is False
    for label, reason in ((None, 'missing field "label"'), ("yes", 'field "label" must be true')):
        bad = write_jsonl(
            tmp_path / "bad.jsonl",
            [{"prompt": "p", "completion": "c", "label": True},
             {"prompt": "p", "completion": "c", "label": label}],
        )  # fmt: skip
        with pytest.raises(DataError) as raised:
            read_conversations(bad, "unpaired")
        assert f"{bad}:2: " in str(raised.value) and reason in str(raised.value)
