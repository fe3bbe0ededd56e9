"""A step's numbers, read one step late: once the next step is queued, so that the GPU never
waits for the host between steps. A step the loop acts on (evaluation, checkpoint, stop, the
last one) is read at once. On the CPU a step runs as it is queued, so it is read at once too
(read later, the last step would seem to take no time).

A step's time runs from the previous step's numbers read (or its own start, when nothing was
queued before it) to its own numbers read: in steady state, the period."""

import time
from collections.abc import Callable
from typing import Any

from tuneforge.train.step import StepResult

OnRead = Callable[[dict[str, Any], int, float], None]
"""(the step's numbers, its index, its time in seconds)."""


class PendingStep:
    def __init__(self, on_read: OnRead) -> None:
        self.on_read = on_read
        self.queued: tuple[StepResult, int] | None = None
        self.last_read = time.perf_counter()

    def before_queue(self) -> None:
        if self.queued is None:
            self.last_read = time.perf_counter()

    def push(self, result: StepResult, step: int) -> None:
        """`step` was just queued: the one before it is read now."""
        self.read()
        self.queued = (result, step)

    def read(self) -> bool:
        """Read the step still pending, if any; says whether there was one."""
        if self.queued is None:
            return False
        (result, step), self.queued = self.queued, None
        values = result.get()
        now = time.perf_counter()
        step_s, self.last_read = now - self.last_read, now
        self.on_read(values, step, step_s)
        return True
