import json

import pytest

from tuneforge.config import load_config
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.splits import check_disjoint_files, split_off
from tuneforge.train.loop import Trainer

REPO_DEMO = "examples/demo.yaml"


def test_split_off_is_seeded_disjoint_and_complete():
    conversations = [Conversation([], f"f:{i}", text=str(i)) for i in range(100)]
    train, held_out = split_off(conversations, 0.1, seed=3)
    assert len(held_out) == 10 and len(train) == 90
    assert {c.origin for c in train}.isdisjoint({c.origin for c in held_out})
    assert split_off(conversations, 0.1, seed=3)[1] == held_out
    assert split_off(conversations, 0.1, seed=4)[1] != held_out


def test_an_eval_file_with_the_training_contents_is_refused(tmp_path):
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (tmp_path / "train.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "copy.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match="same contents as training file"):
        check_disjoint_files([tmp_path / "train.jsonl"], [tmp_path / "copy.jsonl"])


def test_trainer_holds_out_a_fraction_when_asked(tmp_path):
    config = load_config(
        REPO_DEMO,
        [
            f"run.output_dir={tmp_path / 'run'}",
            "data.eval=[]",
            "eval.every_steps=null",
            "data.eval_fraction=0.05",
            "train.max_steps=1",
        ],
    )
    trainer = Trainer(config)
    trainer.setup()
    held = {c.origin for c in trainer.eval_conversations}
    assert len(held) == 1000
    assert trainer.train_stats.num_records == 19000
    assert trainer.eval_batches


def test_weights_repeat_or_subsample_and_held_out_records_never_repeat_into_training(tmp_path):
    from tuneforge.config.sections.data import DataSection
    from tuneforge.data.training_data import training_conversations

    for name, count in (("a", 40), ("b", 40)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"{name}{i}"},
                            {"role": "assistant", "content": "x"},
                        ]
                    }
                )
                + "\n"
                for i in range(count)
            )
        )
    data = DataSection(
        train=[
            {"path": tmp_path / "a.jsonl", "weight": 2},
            {"path": tmp_path / "b.jsonl", "weight": 0.5},
        ],
        eval_fraction=0.1,
    )
    mix, held_out = training_conversations(data, seed=0)
    held = {c.origin for c in held_out}
    assert len(held) == 8
    assert held.isdisjoint(c.origin for c in mix)
    from_a = [c for c in mix if c.origin.startswith(str(tmp_path / "a.jsonl"))]
    from_b = [c for c in mix if c.origin.startswith(str(tmp_path / "b.jsonl"))]
    kept_a = 40 - sum(o.startswith(str(tmp_path / "a.jsonl")) for o in held)
    kept_b = 40 - sum(o.startswith(str(tmp_path / "b.jsonl")) for o in held)
    assert len(from_a) == 2 * kept_a and len(set(c.origin for c in from_a)) == kept_a
    assert len(from_b) == round(kept_b / 2) and len(set(c.origin for c in from_b)) == len(from_b)
    assert training_conversations(data, seed=0)[0] == mix
