"""On a GPU a step's numbers are read one step late, except on the steps the loop acts on
(projection, checkpoints, the last): every logged step time is still the time that step took,
and together they are the time the run took. Runs on the device here (the GPU where there is one)."""

import statistics
import time

from tests.cli_runs import DEMO, overrides
from tuneforge.config import load_config
from tuneforge.runs.files import read_metrics
from tuneforge.train.loop import Trainer


def test_logged_step_times_add_up_to_the_run_and_none_is_free(tmp_path):
    run = tmp_path / "run"
    config = load_config(
        DEMO,
        overrides(
            run,
            "train.max_steps=24",
            "logging.projection_step=7",
            "train.warmup_steps=0",
            "checkpoint.save_steps=12",
        ),
    )
    trainer = Trainer(config)
    trainer.setup()
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began
    trainer.close()
    records = [r for r in read_metrics(run / "metrics.jsonl") if "step_s" in r]
    times = {r["step"]: r["step_s"] for r in records}
    assert sorted(times) == list(range(1, 25))
    steady = statistics.median(times[s] for s in range(3, 25))
    for step in (7, 12, 24):  # the projection, a checkpoint, the last
        assert 0.3 * steady < times[step] < 3.5 * steady, (step, times)
    assert sum(times.values()) <= wall * 1.02
    assert sum(times[s] for s in range(3, 25)) > 0.5 * wall
