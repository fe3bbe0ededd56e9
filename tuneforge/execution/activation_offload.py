"""Blocks whose saved activations wait in pinned host memory for backward.

Checkpointing keeps a block's input and runs the block again in backward; here the block runs
once, and everything its autograd graph saves (the compiled graph's saved set, or eager
autograd's) goes to pinned host memory on a side stream while the forward goes on, and comes
back for its backward. A block costs the round trip of its activations over PCIe instead of
its recomputation: worth it while the copies hide behind compute, i.e. for some of the blocks.

What is copied is each saved tensor's whole storage, once per storage, and restored with the
same sizes and strides (compiled backward graphs check them) at the same alignment, all of a
block's storages into one of the chain's staging slots. The block's weights and
the inputs it shares with the other blocks (rotary tables, document boundaries) stay where they
are, and so does anything smaller than `min_bytes`. The storages stay referenced until the
block's forward ends, so no address is reused under a copy that is still wanted.

Offloaded blocks join the model's `OffloadChain`: once a block's backward has reached its input,
the block below starts coming back (its activations, or a checkpointed block's input).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, is_dataclass

import torch
from torch import nn

from tuneforge.execution.offloaded_checkpoints import HostCopy, OffloadChain
from tuneforge.execution.staging_slots import aligned

MIN_OFFLOAD_BYTES = 2**20


@dataclass(frozen=True)
class _OnHost:
    storage: int
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class SavedOnHost:
    """One block's saved tensors during one step: `pack` and `unpack` are autograd's saved
    tensor hooks; `prefetch` starts them back, `release` drops the restored copies."""

    def __init__(self, stays: set[int], min_bytes: int) -> None:
        self.stays, self.min_bytes = stays, min_bytes
        self.copies: dict[int, HostCopy] = {}
        self.live: dict[int, torch.UntypedStorage] = {}
        self.restored: dict[int, torch.Tensor] = {}
        self.chain: OffloadChain | None = None
        self.fetched = False

    @property
    def nbytes(self) -> int:
        return sum(aligned(copy.nbytes) for copy in self.copies.values())

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | _OnHost:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.stays or storage.nbytes() < self.min_bytes:
            return tensor
        if key not in self.copies:
            self.live[key] = storage
            self.copies[key] = HostCopy(_bytes_of(storage, tensor.device))
        offset = int(tensor.storage_offset())
        return _OnHost(key, tensor.dtype, tensor.size(), tensor.stride(), offset)

    def unpack(self, packed: torch.Tensor | _OnHost) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        flat = self.restored.get(packed.storage)
        if flat is None:
            self.prefetch()
            flat = self.restored[packed.storage] = self.copies[packed.storage].restore()
        view = torch.empty(0, dtype=packed.dtype, device=flat.device)
        offset = flat.storage_offset() // view.element_size() + packed.offset
        return view.set_(flat.untyped_storage(), offset, packed.size, packed.stride)

    def seal(self) -> None:
        """The block's forward is over: its GPU storages may go once their copies are done."""
        self.live.clear()

    def wait_sent(self) -> None:
        """The host waits until the copies to the host have ended (one stream, in order)."""
        if self.copies:
            next(reversed(self.copies.values())).wait_sent()

    def prefetch(self) -> None:
        """Start every storage's copy back, into one of the chain's staging slots."""
        if self.fetched:
            return
        self.fetched = True
        device = next(iter(self.copies.values())).device if self.copies else None
        chain = self.chain
        slot = chain.take_slot(self, self.nbytes, device) if chain and device else None
        start = 0
        for copy in self.copies.values():
            if slot is None:
                copy.prefetch()
                continue
            into, after = slot
            copy.copy_back(into[start : start + copy.nbytes], after)
            start += aligned(copy.nbytes)
            assert chain is not None and copy.arrived is not None  # a slot came from the chain
            chain.slots.copied(self, copy.arrived)

    def release(self) -> None:
        self.restored.clear()


class _BackwardReached(torch.autograd.Function):
    """Identity on a block's input; its backward runs once the block's backward has given the
    input its gradient: the block's restored activations go, the block below starts back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, chain: OffloadChain, saved: SavedOnHost) -> torch.Tensor:
        ctx.chain, ctx.saved = chain, saved
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.saved.release()
        ctx.chain.done(ctx.saved)
        return grad, None, None


def offloaded_activations(
    run: Callable[..., torch.Tensor],
    module: nn.Module,
    chain: OffloadChain,
    min_bytes: int | None = None,
) -> Callable[..., torch.Tensor]:
    """`run(x, *rest)` (the forward of `module`) with its saved activations in host memory
    (those of at least `min_bytes`, by default `MIN_OFFLOAD_BYTES`)."""

    def forward(x: torch.Tensor, *rest) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return run(x, *rest)
        stays = {t.untyped_storage().data_ptr() for t in _tensors_of(module, rest)}
        saved = SavedOnHost(stays, MIN_OFFLOAD_BYTES if min_bytes is None else min_bytes)
        chain.push(saved)
        if x.requires_grad:
            x = _BackwardReached.apply(x, chain, saved)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = run(x, *rest)
        saved.seal()
        return out

    return forward


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    flat = torch.empty(0, dtype=torch.uint8, device=device)
    return flat.set_(storage, 0, (storage.nbytes(),), (1,))


def _tensors_of(module: nn.Module, rest: Iterable) -> list[torch.Tensor]:
    """The module's parameters and buffers and the tensors in `rest` (tuples, dataclasses)."""
    found = [*module.parameters(), *module.buffers()]
    pending = list(rest)
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            pending.extend(item)
        elif is_dataclass(item):
            pending.extend(getattr(item, field.name) for field in fields(item))
    return found
