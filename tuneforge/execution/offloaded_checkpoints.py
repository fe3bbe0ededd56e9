"""Activation checkpointing whose one kept tensor, the block's input, waits in pinned host memory.

Plain checkpointing keeps each checkpointed block's input on the GPU until backward (one
[tokens, dim] tensor per block: 1 GiB for 32 blocks of a 4096-wide model at 4,096 tokens). Here
the forward copies it to pinned host memory on a side stream and runs the block without
keeping anything; backward brings it back, runs the block again with gradients and
differentiates it. The block's trainable parameters are inputs of the autograd function, so
their gradients reach them through autograd's own accumulation (and its hooks).

Blocks offloaded through one `OffloadChain` prefetch: when a block's backward has been queued,
the input of the block below it starts its way back on the side stream, into one of the
chain's two staging slots (`parallel/staging_slots.py`), while the GPU still runs the queued
backward: the copy leaves the compute stream and hides behind its work.

One process only, and no router auxiliary loss: the block's forward runs without gradients, so
a loss taken from its intermediate values (the MoE router's) would get none.
"""

import weakref
from collections.abc import Callable

import torch
from torch import nn

from tuneforge.execution.staging_slots import StagingSlots

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
    host does not). Pushed on an `OffloadChain`, it comes back into the chain's staging slots."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device = tensor.device
        self.sent: torch.cuda.Event | None = None
        self.arrived: torch.cuda.Event | None = None
        self.back: torch.Tensor | None = None
        self.chain: OffloadChain | None = None
        self.owns_back = False
        if tensor.device.type != "cuda":
            self.host = tensor.detach().clone()
            return
        stream = _copy_stream(tensor.device, "to_host")
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor.detach(), non_blocking=True)
            self.sent = torch.cuda.Event()
            self.sent.record(stream)
        tensor.record_stream(stream)  # the GPU memory is not reused before the copy ends

    @property
    def nbytes(self) -> int:
        return self.host.nbytes

    def wait_sent(self) -> None:
        """The host waits until the copy to the host has ended (its GPU memory is free)."""
        if self.sent is not None:
            self.sent.synchronize()

    def prefetch(self) -> None:
        if self.back is not None:
            return
        chain = self.chain
        slot = chain.take_slot(self, self.nbytes, self.device) if chain else None
        self.copy_back(*(slot or (None, None)))
        if chain is not None and slot is not None and self.arrived is not None:
            chain.slots.copied(self, self.arrived)

    def copy_back(self, into: torch.Tensor | None, after: torch.cuda.Event | None) -> None:
        """Start the copy back into `into` (bytes on the device; the copy waits for `after`),
        or into memory allocated on the side stream."""
        if self.sent is None:
            self.back = self.host
            return
        stream = _copy_stream(self.device, "to_device")
        stream.wait_event(self.sent)  # after the copy to the host
        if after is not None:
            stream.wait_event(after)
        with torch.cuda.stream(stream):
            if into is None:
                back = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
            else:
                back = into.view(self.host.dtype).view(self.host.shape)
            self.owns_back = into is None
            back.copy_(self.host, non_blocking=True)
            self.back, self.arrived = back, torch.cuda.Event()
            self.arrived.record(stream)

    def restore(self) -> torch.Tensor:
        self.prefetch()
        back, self.back = self.back, None
        assert back is not None  # prefetch made it
        if self.arrived is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(self.arrived)
            if self.owns_back:
                back.record_stream(compute)  # made on the side stream, freed after compute's use
        return back


class OffloadChain:
    """The offloaded blocks of one model, in forward order: what a block's backward prefetches,
    the staging slots the copies back land in, and how far the copies to the host may fall
    behind the forward where memory is tight: once the allocator's reserve is within
    `in_flight_blocks` of the largest block's bytes of its limit, the host waits for the copies
    older than that, so that the memory they read is free before more is asked for, instead of
    the allocator finding no room and freeing its whole cache (a wait for the GPU and hundreds
    of `cudaMalloc`/`cudaFree` per step). Elsewhere the forward runs ahead of them."""

    def __init__(self, in_flight_blocks: float = 2.0) -> None:
        self.pending: list[weakref.ref] = []
        self.slots = StagingSlots()
        self.in_flight_blocks = in_flight_blocks

    def push(self, item) -> None:
        """`item` (a `HostCopy` or a block's saved tensors) starts its way to the host."""
        item.chain = self
        live = self._live(item)
        if not live:
            self._new_forward()
        self.pending = [*live, weakref.ref(item)]
        self._limit_in_flight()

    def done(self, item) -> None:
        """`item`'s block has queued its backward: drop it, prefetch the one pushed before it."""
        self.slots.release(item)
        self.pending = self._live(item)
        earlier = self.pending[-1]() if self.pending else None
        if earlier is not None:
            earlier.prefetch()
        elif not self.pending:
            self.slots.clear()  # backward is over: the next forward may use their memory

    def take_slot(self, item, nbytes: int, device: torch.device):
        if device.type != "cuda":
            return None
        return self.slots.take(item, nbytes, device)

    def _new_forward(self) -> None:
        """A backward that stopped before its end (an error) left the slots held: free them."""
        if self.slots.held():
            self.slots.clear()

    def _limit_in_flight(self) -> None:
        sent = [item for ref in self.pending[:-1] if (item := ref()) is not None]
        limit = self.in_flight_blocks * max((item.nbytes for item in sent), default=0)
        if not sent or not memory_is_tight(limit):
            return
        total = 0
        for item in reversed(sent):
            total += item.nbytes
            if total > limit:
                item.wait_sent()  # and those before it: one stream copies them in order
                return

    def _live(self, leaving) -> list[weakref.ref]:
        """The items still held by a graph, but `leaving`."""
        return [ref for ref in self.pending if ref() is not None and ref() is not leaving]


def memory_is_tight(margin: float) -> bool:
    """The caching allocator's reserve is within `margin` bytes of what it may hold: the GPU's
    memory, or the fraction of it a process was given (the CUDA context's few hundred MiB are
    within the margins this is asked with: two blocks' activations). Always on a machine without
    a GPU, where there is nothing to wait for."""
    if not torch.cuda.is_available():
        return True
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    allowed = total * torch.cuda.get_per_process_memory_fraction(device)
    return torch.cuda.memory_reserved(device) + margin > allowed


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
