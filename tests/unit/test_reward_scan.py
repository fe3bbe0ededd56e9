"""`doctor log` on a reinforcement-learning run's metrics: the reward's collapse, groups with
nothing to learn and the KL's blow-up are found from the metrics lines, and a healthy run has
none of them."""

import json

from tuneforge.doctor.log_scan import scan_log


def lines(rewards, zero_std=0.2, kl=None):
    records = []
    for step, reward in enumerate(rewards, 1):
        record = {"step": step, "loss": 0.01, "reward": reward, "frac_zero_std": zero_std}
        if kl is not None:
            record["kl"] = kl(step)
        records.append(json.dumps(record))
    return ["a line that is no record", *records]


def codes(report):
    return {finding.code for finding in report.findings}


def test_a_healthy_run_has_no_findings():
    rising = [0.3 + 0.01 * step for step in range(40)]
    assert codes(scan_log(lines(rising, kl=lambda step: 0.01))) == set()


def test_a_collapsed_reward_is_found_with_its_best_and_last():
    rewards = [0.2] * 10 + [0.8] * 20 + [0.1] * 10
    report = scan_log(lines(rewards))
    assert codes(report) == {"reward_collapse"}
    (finding,) = report.findings
    assert "0.100" in finding.message and "0.800" in finding.message


def test_groups_with_nothing_to_learn_are_found():
    assert codes(scan_log(lines([1.0] * 30, zero_std=0.95))) == {"zero_std_groups"}
    # only the recent steps count: a run that found its signal again is healthy
    early = lines([0.5] * 20, zero_std=0.95)
    later = lines([0.5] * 10, zero_std=0.3)[1:]
    assert codes(scan_log(early + later)) == set()


def test_a_kl_blowup_is_found():
    report = scan_log(lines([0.5] * 30, kl=lambda step: 0.01 if step < 20 else 2.0))
    assert codes(report) == {"kl_blowup"}
    assert "2.00 nats per token" in report.findings[0].message
