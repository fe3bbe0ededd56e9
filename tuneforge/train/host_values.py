"""Device values on their way to host memory, read only when needed: the host goes on queueing
work while the copy waits in the GPU's queue."""

import torch

HostValues = tuple[torch.Tensor, "torch.cuda.Event | None"]


def values_to_host(values: torch.Tensor) -> HostValues:
    """`values` on their way to host memory, and the event that says they arrived: reading them
    waits for the GPU only up to this point of its queue."""
    if values.device.type != "cuda":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def read_host_values(values: HostValues) -> list:
    host, ready = values
    if ready is not None:
        ready.synchronize()
    return host.tolist()
