"""Two GPU buffers that offloaded blocks come back into from host memory, in turn.

Without them each copy back allocates its GPU memory on the copy stream, and the caching
allocator keeps a pool per stream: what the copies leave cached after backward cannot serve the
compute stream's forward, so a run held to a memory limit frees its whole cache and retries (a
wait for the GPU and hundreds of `cudaMalloc`/`cudaFree` per step).

The buffers belong to the compute stream. Block i comes back into the slot that block i+2
used; the copy waits, on the GPU, for the event recorded when block i+2's backward was queued,
and the compute stream waits for the copy before it reads. The slots live from backward's first
copy to its last block and are then given back to the compute stream's pool for the next
forward (kept from one backward to the next instead, the run was slower).
"""

import torch

ALIGNMENT = 512
"""Bytes: each tensor in a slot starts where a fresh allocation would be aligned."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class StagingSlots:
    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = [None, None]
        self.reusable_after: list[torch.cuda.Event | None] = [None, None]
        self.last_copy: list[torch.cuda.Event | None] = [None, None]
        self.occupant: list[int | None] = [None, None]
        self.turn = 0

    def take(self, holder: object, nbytes: int, device: torch.device):
        """A `nbytes` uint8 view for `holder`'s copy back and the event the copy must wait
        for; None where the next slot is still held (the caller allocates on its own)."""
        index = self.turn
        if self.occupant[index] is not None:
            return None
        self.turn = 1 - index
        buffer = self.buffers[index]
        if buffer is None or buffer.numel() < nbytes:
            self._drop(index)
            buffer = self.buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.reusable_after[index] = _recorded()  # the memory may serve queued kernels
        self.occupant[index] = id(holder)
        return buffer[:nbytes], self.reusable_after[index]

    def copied(self, holder: object, event: torch.cuda.Event) -> None:
        """`event` ends the copy into `holder`'s slot."""
        index = self._index_of(holder)
        if index is not None:
            self.last_copy[index] = event

    def release(self, holder: object) -> None:
        """`holder`'s block has queued all its reads of the slot: the next copy may follow."""
        index = self._index_of(holder)
        if index is not None:
            self.reusable_after[index] = _recorded()
            self.occupant[index] = None

    def held(self) -> bool:
        return any(occupant is not None for occupant in self.occupant)

    def clear(self) -> None:
        """The buffers go back to the compute stream's pool."""
        for index in range(2):
            self._drop(index)
            self.occupant[index] = None
        self.turn = 0

    def _drop(self, index: int) -> None:
        buffer, copy = self.buffers[index], self.last_copy[index]
        if buffer is not None and copy is not None:
            # a copy whose block never read it (an interrupted backward) must end first
            torch.cuda.current_stream(buffer.device).wait_event(copy)
        self.buffers[index] = self.reusable_after[index] = self.last_copy[index] = None

    def _index_of(self, holder: object) -> int | None:
        return next((i for i in range(2) if self.occupant[i] == id(holder)), None)


def _recorded() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event
