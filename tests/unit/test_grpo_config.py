"""The `grpo:` section's pinned keys, its rules, and the built-in rewards against their
definitions."""

import pytest

from tuneforge.config import load_config
from tuneforge.config.errors import ConfigError
from tuneforge.config.objectives.grpo import GrpoSection
from tuneforge.train.objectives.builtin_rewards import (
    exact_match,
    last_number,
    length_penalty,
    numeric_match,
    regex,
)
from tuneforge.train.objectives.rewards import (
    RewardError,
    reward_functions,
    score,
    weighted_rewards,
)

DEMO = "examples/demo.yaml"
GRPO = ["train.objective=grpo"]


def test_the_pinned_keys_and_their_defaults():
    config = load_config(DEMO, GRPO)
    grpo = config.grpo
    assert (grpo.num_generations, grpo.temperature, grpo.beta) == (8, 1.0, 0.0)
    assert (grpo.loss_type, grpo.scale_rewards, grpo.num_iterations) == ("grpo", "group", 1)
    assert grpo.upper_clip == grpo.epsilon == 0.2
    assert [r.function for r in grpo.rewards] == ["exact_match"] and grpo.reward_weights == [1.0]
    set_ = load_config(
        DEMO,
        [*GRPO, "grpo.max_new_tokens=32", "grpo.top_p=0.9", "grpo.epsilon_high=0.28",
         "grpo.loss_type=dapo", "grpo.scale_rewards=none", "grpo.num_iterations=2",
         "grpo.rewards=[exact_match, {function: regex, pattern: '^\\d+$'}]", "grpo.weights=[1, 0.5]"],
    ).grpo  # fmt: skip
    assert set_.upper_clip == 0.28 and set_.reward_weights == [1.0, 0.5]
    assert set_.rewards[1].pattern == "^\\d+$"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["grpo.weights=[1, 2]"], "grpo.weights"),
        (["grpo.rewards=[regex]"], "grpo.rewards.0.pattern"),
        (["grpo.rewards=[{function: exact_match, field: x}]"], "grpo.rewards.0.field"),
        (["grpo.max_sampling_rounds=0"], "grpo.max_sampling_rounds"),
        (["grpo.epsilon_high=0.1"], "grpo.epsilon_high"),
        (["grpo.rewards=[nonsense]"], "grpo.rewards.0.function"),
        (["grpo.loss_type=ppo"], "grpo.loss_type"),
        (["grpo.num_generations=1"], "grpo.num_generations"),
        (["parallel.tensor_parallel=2"], "parallel.tensor_parallel"),
        (["train.cuda_graph=true"], "train.cuda_graph"),
    ],
)
def test_bad_settings_are_refused_with_their_field(overrides, field):
    with pytest.raises(ConfigError) as caught:
        load_config(DEMO, [*GRPO, *overrides])
    assert field in str(caught.value)


def test_prompts_alone_are_refused_where_no_reply_is_sampled():
    source = "data.train=[{path: tuneforge/assets/demo_data/train.jsonl, format: prompt}]"
    with pytest.raises(ConfigError, match=r"data\.train\.0\.format.*does not sample one"):
        load_config(DEMO, [source])
    assert load_config(DEMO, [source, *GRPO]).data.train[0].format == "prompt"


def test_the_built_in_rewards_follow_their_definitions():
    assert exact_match(["  7 ", "8", "7"], ["7", "7", " 7"]) == [1.0, 0.0, 1.0]
    tagged = regex(r"<answer>.*</answer>")
    assert tagged(["<answer>\n3\n</answer>", "3"]) == [1.0, 0.0]
    # DAPO's soft overlong penalty: 0 up to 12 tokens, -1 at 16 and beyond
    penalty = length_penalty(16, 4)
    lengths = [0, 12, 13, 14, 16, 20]
    assert penalty([[1] * n for n in lengths]) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


def test_rewards_are_weighted_and_a_none_adds_nothing(tmp_path, monkeypatch):
    (tmp_path / "partial.py").write_text(
        "def half(completions, **_):\n    return [None if c == 'x' else 0.5 for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    grpo = GrpoSection(rewards=["exact_match", "partial:half"], weights=[2.0, 1.0])
    functions = reward_functions(grpo)
    assert [f.name for f in functions] == ["exact_match", "half"]
    table = score(functions, ["p", "p"], ["7", "x"], [[1], [2]], ["7", "7"])
    assert table[0].tolist() == [1.0, 0.5] and table[1, 0] == 0.0 and table[1, 1].isnan()
    assert weighted_rewards(table, functions).tolist() == [2.5, 0.0]


def test_a_users_reward_reads_the_records_fields(tmp_path, monkeypatch):
    """Each record field reaches the functions as a keyword, a value per completion (None where
    the record lacks it); a field under one of the functions' own names is refused."""
    (tmp_path / "fielded.py").write_text(
        "def solved(completions, solution, **_):\n"
        "    return [None if s is None else float(c == s) for c, s in zip(completions, solution)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    functions = reward_functions(GrpoSection(rewards=["fielded:solved"]))
    records = [{"solution": "7"}, {"solution": "8"}, {}]
    table = score(functions, ["p"] * 3, ["7", "7", "7"], [[1]] * 3, ["", "", ""], records)
    assert table[:2, 0].tolist() == [1.0, 0.0] and table[2, 0].isnan()
    with pytest.raises(RewardError, match=r"both a reference reply and a field named 'answer'"):
        score(functions, ["p"], ["7"], [[1]], ["7"], [{"answer": "7"}])
    with pytest.raises(RewardError, match=r"field named 'completions'.*rename it"):
        score(functions, ["p"], ["7"], [[1]], [None], [{"completions": "7"}])


def test_numeric_match_compares_the_last_numbers_written():
    """GSM8K's answers end `#### 1,234`: the last number on each side, commas dropped; None
    where the reference has no number. A prompt alone's `answer` field is its answer."""
    assert last_number("so 3 + 4 = 7.\n#### 1,234") == 1234.0
    assert last_number("x = -2.5") == -2.5 and last_number("none") is None
    check = numeric_match(None, 1e-6)
    completions = ["It is 72.", "72.0", "about 71", "no idea", "7"]
    answers = ["... #### 72", 72, "#### 72", "#### 72", "n/a"]
    assert check(completions=completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, None]
    by_field = numeric_match("solution", 0.5)
    assert by_field(completions=["3.4", "3.6"], answer=[None, None], solution=[3, 3]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="no field 'solution'"):
        by_field(completions=["3"], answer=["3"])
    functions = reward_functions(GrpoSection(rewards=["numeric_match", "exact_match"]))
    table = score(
        functions, ["p"] * 2, ["72", "71"], [[1]] * 2, [None, None], [{"answer": "#### 72"}] * 2
    )
    assert table[:, 0].tolist() == [1.0, 0.0] and table[:, 1].tolist() == [0.0, 0.0]
