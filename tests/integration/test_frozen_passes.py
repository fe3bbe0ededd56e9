"""A frozen model's one pass over the data before training, end to end on the CPU: a precomputed
reference trains exactly as the frozen copy it replaces, across a stop and resume too; a teacher's cached
logits distil exactly as the teacher run online (k the whole vocabulary, and top-k against
online top-k); a second run finds the pass's results in the cache."""

import math
import signal
import subprocess
import sys

import pytest

from tests.cli_runs import DEMO, REPO, wait_for_step
from tuneforge.models.api import model_args
from tuneforge.runs.files import read_metrics
from tuneforge.runs.time_budget import EXIT_RESUME

DEMO_DATA = REPO / "tuneforge" / "assets" / "demo_data"


def _head(source, target, count: int):
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:count]))
    return target


def _train(config, run, *settings: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tuneforge", "train", str(config), f"run.output_dir={run}",
               "logging.progress=false", *settings]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _metrics(run, key: str) -> list[float]:
    return [record[key] for record in read_metrics(run / "metrics.jsonl") if key in record]


def test_a_precomputed_reference_trains_as_the_frozen_copy_and_resumes_from_the_run_directory(
    tmp_path,
):
    pairs = _head(DEMO_DATA / "pairs_train.jsonl", tmp_path / "pairs.jsonl", 300)
    held_out = _head(DEMO_DATA / "pairs_eval.jsonl", tmp_path / "eval.jsonl", 30)
    config = tmp_path / "dpo.yaml"
    config.write_text(
        f"extends: {DEMO}\n"
        f"data: {{train: [{{path: {pairs}, format: preference}}], "
        f"eval: [{{path: {held_out}, format: preference}}], cache_dir: {tmp_path / 'cache'}}}\n"
        "train: {objective: dpo, max_steps: 30, lr: 1.0e-3, warmup_steps: 1}\n"
        "eval: {every_steps: 15, num_samples: 0}\n"
        "logging: {log_steps: 1}\n"
    )
    copy = _train(config, tmp_path / "copy", "dpo.reference=frozen_copy")
    assert copy.returncode == 0, copy.stdout + copy.stderr
    run = tmp_path / "pre"
    command = [sys.executable, "-m", "tuneforge", "train", str(config), f"run.output_dir={run}",
               "logging.progress=false", "dpo.reference=precomputed"]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(run, 3, first)
    first.send_signal(signal.SIGTERM)  # saves and exits 75
    out, err = first.communicate(timeout=600)
    assert first.returncode == EXIT_RESUME and "one pass" in out + err, out + err
    job = subprocess.run(
        [*command, "--resume", "auto"], capture_output=True, text=True, timeout=600
    )
    logs = job.stdout + job.stderr
    assert job.returncode == 0 and "resumed from" in logs and "one pass" not in logs, logs
    for key in ("loss", "reward_margin", "eval_loss", "eval_reward_accuracy"):
        assert _metrics(run, key) == pytest.approx(_metrics(tmp_path / "copy", key), abs=1e-6)
    assert _metrics(run, "loss")[0] == pytest.approx(math.log(2), abs=1e-6)
    again = _train(config, tmp_path / "again", "dpo.reference=precomputed", "train.max_steps=1")
    assert again.returncode == 0 and "one pass" not in again.stdout + again.stderr


def test_cached_teacher_logits_distil_as_the_teacher_run_online(tmp_path):
    train = _head(DEMO_DATA / "train.jsonl", tmp_path / "train.jsonl", 300)
    held_out = _head(DEMO_DATA / "eval.jsonl", tmp_path / "eval.jsonl", 30)
    config = tmp_path / "kd.yaml"
    config.write_text(
        f"extends: {DEMO}\n"
        f"data: {{train: [{{path: {train}}}], eval: [{{path: {held_out}}}], "
        f"cache_dir: {tmp_path / 'cache'}}}\n"
        "train: {objective: distill, max_steps: 3}\n"
        "distill: {teacher: {name: demo-tiny, init_std: 0.2}, kd_weight: 0.9, temperature: 2.0}\n"
        "eval: {every_steps: 3, num_samples: 0}\n"
        "logging: {log_steps: 1}\n"
    )
    vocabulary = model_args("demo-tiny").vocab_size
    runs = {
        "online": [],
        "cached": ["distill.teacher_logits=cached", f"distill.top_k={vocabulary}"],
        "online8": ["distill.top_k=8"],
        "cached8": ["distill.teacher_logits=cached", "distill.top_k=8"],
        "cached8_again": ["distill.teacher_logits=cached", "distill.top_k=8"],
    }
    outputs = {}
    for name, settings in runs.items():
        result = _train(config, tmp_path / name, *settings)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs[name] = result.stdout + result.stderr
    for online, cached in (("online", "cached"), ("online8", "cached8")):
        for key in ("kd_loss", "loss", "eval_kd_loss"):
            found = _metrics(tmp_path / cached, key)
            assert found == pytest.approx(_metrics(tmp_path / online, key), rel=1e-5)
    assert "one pass" in outputs["cached8"]
    assert "one pass" not in outputs["cached8_again"]
    assert "teacher: demo-tiny" not in outputs["cached8_again"]  # not even loaded
    assert _metrics(tmp_path / "cached8_again", "kd_loss") == _metrics(
        tmp_path / "cached8", "kd_loss"
    )


def test_a_resume_without_the_runs_reference_values_or_with_others_is_refused_naming_them(
    tmp_path,
):
    """The checkpoint keeps the values' digest (the objective's resume state): files replaced
    since are refused, as missing ones are."""
    import numpy as np

    from tuneforge.errors import TuneforgeError
    from tuneforge.train.frozen.precomputed_reference import (
        RUN_FILES,
        values_digest,
        values_from_run_dir,
    )

    with pytest.raises(TuneforgeError, match=r"reference_logps.npy.*cannot be made again"):
        values_from_run_dir(tmp_path, {})
    train, held_out = np.arange(6, dtype=np.float32), np.ones(2, dtype=np.float32)
    for name, values in zip(RUN_FILES, (train, held_out), strict=True):
        np.save(tmp_path / name, values)
    state = {"reference_logps_sha256": values_digest(train, held_out)}
    found, _ = values_from_run_dir(tmp_path, state)
    assert np.array_equal(found, train)
    np.save(tmp_path / RUN_FILES[0], train + 1)
    with pytest.raises(TuneforgeError, match=r"not the values the run started with"):
        values_from_run_dir(tmp_path, state)


def test_a_frozen_pass_that_cannot_write_its_results_says_where_and_what_to_do(tmp_path):
    from tuneforge.errors import TuneforgeError
    from tuneforge.parallel.distributed import Dist
    from tuneforge.train.frozen.passes import FrozenPassData, on_main_then_all

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    data = FrozenPassData(None, [], tmp_path, Dist(), None)  # type: ignore[arg-type]
    with pytest.raises(TuneforgeError, match=r"data\.cache_dir to a writable place"):
        on_main_then_all(data, blocked / "teacher" / "key", lambda partial: None)
