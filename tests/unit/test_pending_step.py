"""Each step's logged time is the time the device took for it, also on the steps the loop reads
at once (projection, evaluation, the last one) and where queueing a step waits for the device.
A simulated device (a worker thread that runs queued steps in order and stamps when each ends)
stands in for the GPU; the host reads a step's numbers as the trainer does."""

import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from tuneforge.train.pending import PendingStep

STEP_S = 0.04


class DeviceStep:
    """A queued step: its numbers wait for the device; `done` is when the device finished it."""

    def __init__(self, finished: Future) -> None:
        self.finished = finished

    def get(self) -> dict:
        self.finished.result()
        return {"loss": 1.0}

    @property
    def done(self) -> float:
        return self.finished.result()


def run(steps: int, read_now: set[int], waits_inside: bool) -> tuple[list[float], float]:
    """Logged step times and the wall time of the whole run."""
    device = ThreadPoolExecutor(max_workers=1)

    def work() -> float:
        time.sleep(STEP_S)
        return time.perf_counter()

    logged: list[float] = []
    pending = PendingStep(lambda values, step, seconds: logged.append(seconds), torch.device("cpu"))
    pending.start = None
    began = time.perf_counter()
    for step in range(1, steps + 1):
        pending.before_queue()
        queued = DeviceStep(device.submit(work))
        if waits_inside:  # e.g. an optimizer that reads the loss on the host before its update
            queued.finished.result()
        pending.push(queued, step)
        if step in read_now:
            pending.read()
    pending.read()
    device.shutdown()
    return logged, time.perf_counter() - began


@pytest.mark.parametrize("waits_inside", [False, True])
def test_every_logged_step_time_is_the_time_the_step_took(waits_inside):
    logged, wall = run(12, read_now={5, 12}, waits_inside=waits_inside)
    assert len(logged) == 12
    for seconds in logged:
        assert STEP_S * 0.8 < seconds < STEP_S * 2.5, logged
    assert sum(logged) == pytest.approx(wall, rel=0.25)
