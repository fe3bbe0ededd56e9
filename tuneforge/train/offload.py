"""Activation checkpointing whose one kept tensor, the block's input, waits in pinned host memory.

Plain checkpointing keeps each checkpointed block's input on the GPU until backward (one
[tokens, dim] tensor per block: 1 GiB for 32 blocks of a 4096-wide model at 4,096 tokens). Here
the forward copies it to pinned host memory on a side stream and runs the block without
keeping anything; backward brings it back, runs the block again with gradients and
differentiates it. The block's trainable parameters are inputs of the autograd function, so
their gradients reach them through autograd's own accumulation (and its hooks).

One process only, and no router auxiliary loss: the block's forward runs without gradients, so
a loss taken from its intermediate values (the MoE router's) would get none.
"""

from collections.abc import Callable

import torch
from torch import nn

_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


class HostCopy:
    """`tensor` copied to pinned host memory on a side stream; `restore` brings it back."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device, self.event = tensor.device, None
        if tensor.device.type != "cuda":
            self.host = tensor.detach().clone()
            return
        stream = _COPY_STREAMS.get(tensor.device)
        if stream is None:
            stream = _COPY_STREAMS[tensor.device] = torch.cuda.Stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor.detach(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(stream)
        tensor.record_stream(stream)  # the GPU memory is not reused before the copy ends

    def restore(self) -> torch.Tensor:
        if self.event is None:
            return self.host
        torch.cuda.current_stream(self.device).wait_event(self.event)
        return self.host.to(self.device, non_blocking=True)


class _OffloadedCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable, x: torch.Tensor, rest: tuple, *params: nn.Parameter):
        ctx.run, ctx.rest, ctx.params = run, rest, params
        ctx.input_requires_grad = x.requires_grad
        ctx.host = HostCopy(x)
        ctx.rng = _rng_state(x.device)
        with torch.no_grad():
            return run(x, *rest)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x = ctx.host.restore().detach().requires_grad_(ctx.input_requires_grad)
        del ctx.host
        with torch.random.fork_rng(_rng_devices(x.device)):
            _set_rng_state(x.device, ctx.rng)
            with torch.enable_grad():
                output = ctx.run(x, *ctx.rest)
        inputs = ([x] if ctx.input_requires_grad else []) + list(ctx.params)
        grads = list(torch.autograd.grad(output, inputs, grad, allow_unused=True))
        input_grad = grads.pop(0) if ctx.input_requires_grad else None
        return None, input_grad, None, *grads


def offloaded_checkpoint(
    run: Callable[..., torch.Tensor], params: list[nn.Parameter]
) -> Callable[..., torch.Tensor]:
    """`run(x, *rest)` checkpointed with `x` kept in host memory; `params` are the trainable
    parameters `run` uses."""

    def forward(x: torch.Tensor, *rest) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return run(x, *rest)
        return _OffloadedCheckpoint.apply(run, x, rest, *params)

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
