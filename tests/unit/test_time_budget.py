"""Durations, deadlines (time_limit and SLURM's end time), the stop margin, the projection at
step 25, and the plot of several runs."""

import json
import logging

import pytest

from tuneforge.config import ConfigError, load_config
from tuneforge.config.durations import parse_duration
from tuneforge.runs.pace import Pace
from tuneforge.runs.projection import project
from tuneforge.runs.time_budget import (
    Deadline,
    find_deadline,
    time_needed_to_stop,
    training_share,
)

DEMO = "examples/demo.yaml"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("45m", 2700),
        ("4h", 14400),
        ("1d", 86400),
        ("01:30:00", 5400),
        ("30:00", 1800),
        ("2-00:00:00", 172800),
        ("2-12", 216000),
        ("600", 600),
    ],
)
def test_durations_in_user_and_slurm_forms(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "00:00:00", "0m"])
def test_a_zero_duration_is_refused(text):
    # SLURM reads --time=0 as no limit: a chain written with it would never resume
    with pytest.raises(ValueError, match="is no time"):
        parse_duration(text)


def test_a_time_limit_in_seconds_is_a_number_or_text():
    assert load_config(DEMO, ["train.time_limit=600"]).train.time_limit == "600"
    with pytest.raises(ConfigError, match=r"train\.time_limit.*'0' is no time"):
        load_config(DEMO, ["train.time_limit=0"])


def test_a_bad_time_limit_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train\.time_limit.*cannot read 'soon'"):
        load_config(DEMO, ["train.time_limit=soon"])


def test_the_sooner_of_time_limit_and_slurm_end_wins(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    assert find_deadline(None, 1000.0).at is None
    assert find_deadline("10m", 1000.0) == Deadline(1600.0, "train.time_limit", 1000.0)
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1300")
    assert find_deadline("10m", 1000.0) == Deadline(1300.0, "the SLURM job's end time", 1000.0)
    assert find_deadline("1m", 1000.0).source == "train.time_limit"


def test_the_margin_grows_with_measured_times():
    assert time_needed_to_stop(2.0, None, 60.0) == 2.0 + 4.0 + 60.0
    assert time_needed_to_stop(2.0, 10.0, 60.0) == 2.0 + 15.0 + 60.0


def pace(step_s: float, steps: int = 25) -> Pace:
    result = Pace()
    for _ in range(steps):
        result.add(step_s)
    return result


def test_the_steady_step_time_is_the_mean_so_that_batches_of_different_cost_add_up():
    """Three cheap batches and a dear one in turn: 100 steps take 100 x 2 s, not 100 x 1 s."""
    result = Pace()
    for seconds in [30.0, 20.0, 10.0] + [1.0, 1.0, 1.0, 5.0] * 10:  # compilation first
        result.add(seconds)
    assert result.steady_step_s == 2.0
    assert result.eta_s(100) == 200.0


def test_projection_counts_jobs_and_flags_unreachable_checkpoints():
    config = load_config(
        DEMO, ["train.max_steps=10000", "train.time_limit=1h", "checkpoint.save_steps=2000"]
    )
    started = 0.0
    deadline = Deadline(3600.0, "train.time_limit")
    # 2 s/step: 1770 steps per 1-hour job (60 s margin), 9975 steps left after step 25
    lines = project(25, 10000, 50.0, pace(2.0), deadline, started, config, now=50.0)
    text = " ".join(message for _, message in lines)
    assert "the run needs 6 jobs" in text
    assert "save_steps=2000" in text and "no periodic checkpoint" in text  # step 2000: 66 min away
    assert any(level == logging.WARNING for level, _ in lines)
    finishing = project(25, 100, 50.0, pace(2.0), deadline, started, config, now=50.0)
    assert "finishes within this job" in " ".join(m for _, m in finishing)


def test_the_next_periodic_checkpoint_is_counted_from_this_step():
    """At step 25 with save_steps=30 the next checkpoint is 5 steps away, not 30."""
    config = load_config(DEMO, ["train.max_steps=100", "checkpoint.save_steps=30"])
    deadline = Deadline(100.0, "the SLURM job's end time", 0.0)
    lines = project(25, 100, 50.0, pace(1.0), deadline, 0.0, config, now=50.0)
    assert not any("periodic checkpoint" in message for _, message in lines)
    far = project(25, 100, 50.0, pace(1.0), deadline, 0.0, config, now=92.0)
    assert any("next periodic checkpoint (step 30" in message for _, message in far)


def test_a_short_job_keeps_a_margin_in_proportion():
    configured = 60.0
    assert Deadline(120.0, "x", 0.0).margin(configured) == 6.0  # a 2-minute job: 5%
    assert Deadline(20.0, "x", 0.0).margin(configured) == 5.0  # never below 5 s
    assert Deadline(38 * 3600.0, "x", 0.0).margin(configured) == 60.0
    assert Deadline(None).margin(configured) == 60.0
    share = training_share(Deadline(120.0, "x", 0.0), now=108.0)
    assert share.startswith("training ran 00:01:48 of the 00:02:00 this job had") and "90%" in share


def test_the_projection_states_the_planners_step_time_and_warns_when_much_slower():
    """The planned step of the run's configuration (the planner's model, its rates named) beside
    the measured pace: information within 25%, a warning with what to check beyond."""
    from tuneforge.plan.pace_check import PaceCheck
    from tuneforge.plan.planner import plan_run
    from tuneforge.plan.prediction import Hardware

    config = load_config(DEMO, ["train.max_steps=100"])
    plan = plan_run(config, Hardware(gpu="H200"))

    def planned(measured_s: float):
        check = PaceCheck(measured_s, plan.step_time_s, plan.rates, plan.step_bound)
        return check.slow, check.describe(), check.advice()

    deadline = Deadline(None, "")
    close = project(25, 100, 50.0, pace(plan.step_time_s * 1.1), deadline, 0.0, config,
                    now=50.0, planned=planned)  # fmt: skip
    ((level, line),) = [(lv, m) for lv, m in close if m.startswith("step time:")]
    assert level == logging.INFO and "(+10%" in line and plan.rates in line
    slow = project(25, 100, 50.0, pace(plan.step_time_s * 2), deadline, 0.0, config,
                   now=50.0, planned=planned)  # fmt: skip
    ((level, line),) = [(lv, m) for lv, m in slow if m.startswith("step time:")]
    assert level == logging.WARNING and "(+100%" in line and "doctor env" in line


def test_doctor_log_with_a_config_compares_the_logs_step_time_with_the_planners(tmp_path):
    from typer.testing import CliRunner

    from tuneforge.cli.main import app
    from tuneforge.plan.planner import plan_run
    from tuneforge.plan.prediction import Hardware

    planned = plan_run(load_config(DEMO, []), Hardware(gpu="H200")).step_time_s
    log_file = tmp_path / "train.log"
    lines = [f"step {s}/600  loss 1.0  step_s: {planned * 3:.4f}" for s in range(1, 40)]
    log_file.write_text("\n".join(lines) + "\n")
    args = ["doctor", "log", str(log_file), "--config", DEMO, "--gpu", "H200", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["planned_step_s"] == pytest.approx(planned)
    (finding,) = [f for f in report["findings"] if f["code"] == "slower_than_planned"]
    assert "+200%" in finding["message"]
    on_plan = [line.replace(f"{planned * 3:.4f}", f"{planned:.4f}") for line in lines]
    log_file.write_text("\n".join(on_plan) + "\n")
    quiet = json.loads(CliRunner().invoke(app, args).output)
    assert not any(f["code"] == "slower_than_planned" for f in quiet["findings"])
