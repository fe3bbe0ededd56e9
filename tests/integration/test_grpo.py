"""GRPO end to end on the demo's tiny model: a run killed and resumed gives the losses of the run
that was never interrupted (the sampler's state and the completions kept for a second iteration
included); a reward function that raises or returns the wrong length stops the run with its
name; the metrics of a step are what its completions say."""

import json
import math
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.cli_runs import DEMO, REPO, cli, finish, losses, overrides, torchrun, wait_for_step
from tuneforge.config import ConfigError, load_config
from tuneforge.runs.files import read_metrics
from tuneforge.train.loop import Trainer
from tuneforge.train.objectives.rewards import RewardError

# a random model rarely ends its turn: a vowel in the completion is a reward that varies
GRPO = [
    "train.objective=grpo",
    "lora.enabled=true",
    "lora.rank=4",
    "train.lr=1e-2",
    "train.tokens_per_micro_batch=128",
    "grpo.num_generations=4",
    "grpo.max_new_tokens=6",
    "grpo.num_iterations=2",
    "grpo.beta=0.04",
    "grpo.epsilon_high=0.28",
    "grpo.rewards=[{function: regex, pattern: '[aeiou]'}]",
    "checkpoint.save_steps=5",
]


@pytest.mark.parametrize("dynamic", [False, True])
def test_grpo_killed_and_resumed_gives_the_uninterrupted_losses(tmp_path, dynamic):
    """With DAPO's dynamic sampling too, whose further reads move the loader on."""
    options = [*GRPO, "grpo.dynamic_sampling=true"] if dynamic else GRPO
    straight = tmp_path / "straight" / "run"
    finish(cli(straight, *options))
    expected = losses(straight)
    assert len(expected) == 12 and any(loss != 0 for loss in expected)
    records = [r for r in read_metrics(straight / "metrics.jsonl") if "loss" in r]
    assert all(r["reward_std"] > 0 and r["frac_zero_std"] < 1 for r in records)  # signal
    assert any(r["clip_ratio"] > 0 for r in records)  # the second iteration's ratios move
    assert all(r["kl"] >= 0 for r in records)
    generated = [r["generation_tokens_per_s"] for r in records]
    # with two iterations every other step samples (accumulation 2: both micro-batches)
    assert all(g is None for g in generated[1::2]) and all(g > 0 for g in generated[0::2])
    if dynamic:  # two micro-batches a step, each read again where groups were rewarded alike
        rounds = [r["sampling_rounds"] for r in records[0::2]]
        assert all(2 <= n <= 6 for n in rounds) and any(n > 2 for n in rounds)

    run = tmp_path / "killed" / "run"
    process = cli(run, *options)
    wait_for_step(run, 7, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    # step 5 sampled the completions step 6 trains on again: the resume needs them
    assert json.loads((run / "checkpoints" / "latest").read_text())["step"] == 5
    finish(cli(run, *options, resume=True))
    assert losses(run) == expected
    # the completion log: one group of each sampling step, its rewards those of its text, and
    # the resumed run's the same lines (the steps it sampled again written once)
    logged = read_metrics(straight / "completions.jsonl")
    assert [r["step"] for r in logged] == [step for step in range(1, 13, 2) for _ in range(4)]
    assert all(
        r["reward"] == float(re.search("[aeiou]", r["completion"]) is not None) for r in logged
    )
    assert all(r["rewards"] == {"regex": r["reward"]} and r["answer"] for r in logged)
    assert (run / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()


def _config(tmp_path, *extra: str):
    return load_config(DEMO, [*overrides(tmp_path / "run", *GRPO), "train.max_steps=2", *extra])


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("raise KeyError('solution')", "raised KeyError: 'solution' at"),
        ("return [1.0]", "returned 1 values for"),
        ("return ['yes'] * len(completions)", "returned str 'yes'"),
        ("return [float('nan')] * len(completions)", "returned nan for the completion of the"),
        ("return [1.0] * (len(completions) - 1) + [float('inf')]", "returned inf for the"),
    ],
)
def test_a_faulty_reward_function_stops_the_run_with_its_name(tmp_path, monkeypatch, body, said):
    module = tmp_path / "my_rewards.py"
    module.write_text(
        textwrap.dedent(
            f"""
            def graded(prompts, completions, **fields):
                {body}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    trainer = Trainer(_config(tmp_path, "grpo.rewards=[my_rewards:graded]"), overwrite=True)
    trainer.setup()
    with pytest.raises(RewardError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "reward function graded (grpo.rewards.0.function)" in message and said in message
    if "for the" in said:  # a non-number: the record it was given, by file and line
        assert re.search(r"record at \S+train\.jsonl:\d+", message), message
    trainer.close()
    run = tmp_path / "run"  # stopped before any update: nothing trained is saved
    assert not (run / "final").exists() and not (run / "adapter").exists()
    assert not list(run.glob("checkpoints/step_*"))


@pytest.mark.parametrize("prompt_alone", [False, True])
def test_each_completion_is_scored_with_its_own_records_fields(tmp_path, monkeypatch, prompt_alone):
    """The records' other fields reach the reward functions through the cache and the packed
    batches, each beside its own prompt: a field holding the record's question is found in the
    prompt of every completion, which ends with the generation prompt — with the reference reply,
    or for a prompt alone (format `prompt`, in padded rows, held out too), where `exact_match`
    has nothing to compare and adds nothing."""
    lines = (REPO / "tuneforge/assets/demo_data/train.jsonl").read_text().splitlines()[:400]
    records = []
    for line in lines:
        messages = json.loads(line)["messages"]
        record = {"prompt": messages[0]["content"]} if prompt_alone else {"messages": messages}
        records.append(record | {"question": messages[0]["content"]})
    data = tmp_path / "fielded.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "fielded_rewards.py").write_text(
        "def aligned(prompts, question, **_):\n"
        "    ends = [p.endswith('<|im_start|>assistant\\n') for p in prompts]\n"
        "    return [float(q in p and e) for p, q, e in zip(prompts, question, ends, strict=True)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    source = f"{{path: {data}, format: {'prompt' if prompt_alone else 'openai'}}}"
    extra = [f"data.train=[{source}]", "grpo.rewards=[fielded_rewards:aligned, exact_match]"]
    extra += ["data.eval_fraction=0.05", "eval.every_steps=2", "eval.num_samples=8"]
    if prompt_alone:  # padded rows: a prompt is its document without its row's padding
        extra.append("data.packing=none")
    for _ in range(2):  # tokenised, then from the cache
        trainer = Trainer(_config(tmp_path, *extra), overwrite=True)
        trainer.setup()
        trainer.train()
        trainer.close()
        written = read_metrics(tmp_path / "run" / "metrics.jsonl")
        steps = [r for r in written if "loss" in r]
        assert len(steps) == 2 and all(r["reward_aligned"] == 1.0 for r in steps)
        held_out = [r for r in written if "eval_loss" in r]
        assert held_out and all(r["eval_reward_aligned"] == 1.0 for r in held_out)
        compared = [r["reward_exact_match"] for r in steps]
        assert all(c == 0.0 for c in compared) if prompt_alone else all(c >= 0 for c in compared)
        assert all(("eval_accuracy" in r) != prompt_alone for r in held_out)
        # one group of the step that sampled, the earlier run's lines gone with --overwrite
        assert len(read_metrics(tmp_path / "run" / "completions.jsonl")) == 4


def test_completions_no_function_scores_are_counted_and_left_out(tmp_path, monkeypatch):
    """Every fourth completion unscored (None): counted in `unscored`, out of the reward's mean;
    their advantages are 0 (tests/unit/test_grpo_against_trl.py checks them against TRL's)."""
    (tmp_path / "partial_rewards.py").write_text(
        "def partial(completions, **_):\n"
        "    return [None if i % 4 == 0 else float(len(c) % 2) for i, c in enumerate(completions)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = Trainer(_config(tmp_path, "grpo.rewards=[partial_rewards:partial]"), overwrite=True)
    trainer.setup()
    trainer.train()
    trainer.close()
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(steps) == 2
    for step in steps:
        assert step["unscored"] == step["completions"] / 4 and step["unscored"] > 0
        assert step["scored"] == step["completions"] - step["unscored"]
        assert math.isfinite(step["loss"]) and 0 <= step["reward"] <= 1


def test_a_reward_function_that_cannot_be_imported_is_refused_before_training(tmp_path):
    trainer = Trainer(_config(tmp_path, "grpo.rewards=[no_such_module_here:score]"))
    with pytest.raises(ConfigError, match=r"grpo\.rewards\.0\.function: cannot import"):
        trainer.setup()
    trainer.close()
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_of_two_ranks_samples_for_its_own_prompts(tmp_path, strategy):
    """DDP and FSDP2 (whose root unit's embedding and output layer are gathered for sampling):
    each rank answers its own prompts, and the step's counts are both ranks' together. Under
    FSDP2 with dynamic sampling, a round one rank wants is sampled by both."""
    run = tmp_path / "run"
    dynamic = ["grpo.dynamic_sampling=true"] if strategy == "fsdp" else []
    args = ["-m", "tuneforge", "train", str(DEMO), *overrides(run, *GRPO, *dynamic),
            "train.max_steps=4", "train.grad_accum_steps=1", f"parallel.strategy={strategy}",
            "--overwrite"]  # fmt: skip
    done = subprocess.run([*torchrun(2), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert len(records) == 4 and all(math.isfinite(r["loss"]) for r in records)
    for record in records:
        assert record["completions"] == 4 * record["groups"] > 4  # both ranks' prompts
        if dynamic and record.get("generation_s"):  # both ranks took the same rounds
            assert record["sampling_rounds"] % 2 == 0 and record["sampling_rounds"] >= 2
    assert any(r["kl"] > 0 for r in records)
