"""Activation checkpointing whose one kept tensor, the block's input, waits in pinned host memory.

Plain checkpointing keeps each checkpointed block's input on the GPU until backward (one
[tokens, dim] tensor per block: 1 GiB for 32 blocks of a 4096-wide model at 4,096 tokens). Here
the forward copies it to pinned host memory on a side stream and runs the block without
keeping anything; backward brings it back, runs the block again with gradients and
differentiates it. The block's trainable parameters are inputs of the autograd function, so
their gradients reach them through autograd's own accumulation (and its hooks).

Blocks offloaded through one `OffloadChain` prefetch: when a block's backward has been queued,
the input of the block below it starts its way back on the side stream, into memory of the
side stream's own, while the GPU still runs the queued backward. Queued at that moment, after
the block's own buffers were freed in the allocator's (the host's) order, the prefetched input
does not add to the step's peak; and the copy leaves the compute stream.

One process only, and no router auxiliary loss: the block's forward runs without gradients, so
a loss taken from its intermediate values (the MoE router's) would get none.
"""

import weakref
from collections.abc import Callable

import torch
from torch import nn

_COPY_STREAMS: dict[tuple[torch.device, str], torch.cuda.Stream] = {}


def _copy_stream(device: torch.device, direction: str) -> torch.cuda.Stream:
    """One side stream per device and direction, so that copies to the host and back overlap
    (PCIe moves both ways at once)."""
    stream = _COPY_STREAMS.get((device, direction))
    if stream is None:
        stream = _COPY_STREAMS[device, direction] = torch.cuda.Stream(device)
    return stream


def copy_stream_names() -> dict[int, str]:
    """The side streams' handles (as the allocator's snapshots name streams) and what they do."""
    return {
        stream.cuda_stream: f"copies {direction}"
        for (_, direction), stream in _COPY_STREAMS.items()
    }


class HostCopy:
    """`tensor` copied to pinned host memory on a side stream; `prefetch` starts the copy back
    on another, `restore` returns it on the device (the compute stream waits for the copy, the
    host does not)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device, self.event, self.back = tensor.device, None, None
        if tensor.device.type != "cuda":
            self.host = tensor.detach().clone()
            return
        stream = _copy_stream(tensor.device, "to_host")
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor.detach(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(stream)
        tensor.record_stream(stream)  # the GPU memory is not reused before the copy ends

    def prefetch(self) -> None:
        if self.back is not None:
            return
        if self.event is None:
            self.back = self.host
            return
        stream = _copy_stream(self.device, "to_device")
        stream.wait_event(self.event)  # after the copy to the host
        with torch.cuda.stream(stream):
            self.back = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
            self.back.copy_(self.host, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(stream)

    def restore(self) -> torch.Tensor:
        self.prefetch()
        back, self.back = self.back, None
        if self.event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(self.event)
            back.record_stream(compute)  # made on the side stream, freed after compute's use
        return back


class OffloadChain:
    """The offloaded blocks of one model, in forward order: what a block's backward prefetches."""

    def __init__(self) -> None:
        self.pending: list[weakref.ref[HostCopy]] = []

    def push(self, copy: HostCopy) -> None:
        self.pending = [*self._live(copy), weakref.ref(copy)]

    def done(self, copy: HostCopy) -> None:
        """`copy`'s block has queued its backward: drop it, prefetch the one pushed before it."""
        self.pending = self._live(copy)
        earlier = self.pending[-1]() if self.pending else None
        if earlier is not None:
            earlier.prefetch()

    def _live(self, leaving: HostCopy) -> list[weakref.ref[HostCopy]]:
        """The copies still held by a graph, but `leaving`."""
        return [ref for ref in self.pending if ref() is not None and ref() is not leaving]


class _OffloadedCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable, chain, x: torch.Tensor, rest: tuple, *params: nn.Parameter):
        ctx.run, ctx.chain, ctx.rest, ctx.params = run, chain, rest, params
        ctx.input_requires_grad = x.requires_grad
        ctx.host = HostCopy(x)
        if chain is not None:
            chain.push(ctx.host)
        ctx.rng = _rng_state(x.device)
        with torch.no_grad():
            return run(x, *rest)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        host = ctx.host
        del ctx.host
        x = host.restore().detach().requires_grad_(ctx.input_requires_grad)
        with torch.random.fork_rng(_rng_devices(x.device)):
            _set_rng_state(x.device, ctx.rng)
            with torch.enable_grad():
                output = ctx.run(x, *ctx.rest)
        inputs = ([x] if ctx.input_requires_grad else []) + list(ctx.params)
        grads = list(torch.autograd.grad(output, inputs, grad, allow_unused=True))
        del output, x
        if ctx.chain is not None:
            ctx.chain.done(host)
        input_grad = grads.pop(0) if ctx.input_requires_grad else None
        return None, None, input_grad, None, *grads


def offloaded_checkpoint(
    run: Callable[..., torch.Tensor],
    params: list[nn.Parameter],
    chain: OffloadChain | None = None,
) -> Callable[..., torch.Tensor]:
    """`run(x, *rest)` checkpointed with `x` kept in host memory; `params` are the trainable
    parameters `run` uses; blocks sharing `chain` prefetch each other's inputs in backward."""

    def forward(x: torch.Tensor, *rest) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return run(x, *rest)
        return _OffloadedCheckpoint.apply(run, chain, x, rest, *params)

    return forward


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
