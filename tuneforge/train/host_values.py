"""Device values on their way to host memory, read only when needed: the host goes on queueing
work while the copy waits in the GPU's queue. The point of the queue where they are ready is
also a mark on the device's own clock, from which a step's time is measured."""

import time

import torch

Mark = float | torch.cuda.Event
"""A point in time: an event on the GPU's queue (timed by the GPU), or the host's clock."""


class HostValues:
    def __init__(self, host: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        self.host, self.ready = host, ready
        self.done: Mark = ready if ready is not None else time.perf_counter()
        """When the work before the values finished (on a CPU: now, it ran as it was queued)."""


def mark_now(device: torch.device) -> Mark:
    """The present point of `device`'s queue: on a GPU, an event recorded at the end of what is
    queued so far; elsewhere the host's clock."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def seconds_between(start: Mark, end: Mark) -> float:
    """Seconds from `start` to `end`, both reached (an event read after its values were)."""
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
    return start.elapsed_time(end) / 1000


def values_to_host(values: torch.Tensor) -> HostValues:
    """`values` on their way to host memory, and the event that says they arrived: reading them
    waits for the GPU only up to this point of its queue."""
    if values.device.type != "cuda":
        return HostValues(values, None)
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    ready = torch.cuda.Event(enable_timing=True)
    ready.record()
    return HostValues(host, ready)


def read_host_values(values: HostValues) -> list:
    if values.ready is not None:
        values.ready.synchronize()
    return values.host.tolist()
