"""A step's numbers, read one step late: once the next step is queued, so that the GPU never
waits for the host between steps. A step the loop acts on (evaluation, checkpoint, stop, the
last one) is read at once. On the CPU a step runs as it is queued, so it is read at once too.

A step's time is measured on the device's clock (`host_values.Mark`): from the end of the step
before it, where that was still queued when this one was, else from when this one began to be
queued, to the end of its own work. When the host reads a step says nothing of when the GPU
ran it: a step with a wait for the GPU inside (an optimizer that checks for non-finite values
on the host, offloading) is queued only once the one before it is done, and read at once."""

from collections.abc import Callable
from typing import Any

import torch

from tuneforge.train.host_values import Mark, mark_now, seconds_between
from tuneforge.train.step import StepResult

OnRead = Callable[[dict[str, Any], int, float], None]
"""(the step's numbers, its index, its time in seconds)."""


class PendingStep:
    def __init__(self, on_read: OnRead, device: torch.device) -> None:
        self.on_read, self.device = on_read, device
        self.queued: tuple[StepResult, int, Mark] | None = None
        self.start: Mark | None = None
        """Where the next step's time starts."""

    def before_queue(self) -> None:
        if self.queued is None or self.start is None:  # nothing pending: the step starts now
            self.start = mark_now(self.device)

    def push(self, result: StepResult, step: int) -> None:
        """`step` was just queued: the one before it is read now."""
        assert self.start is not None, "before_queue() comes first"
        started, self.start = self.start, result.done
        self.read()
        self.queued = (result, step, started)

    def read(self) -> bool:
        """Read the step still pending, if any; says whether there was one."""
        if self.queued is None:
            return False
        (result, step, started), self.queued = self.queued, None
        values = result.get()
        self.on_read(values, step, seconds_between(started, result.done))
        return True
