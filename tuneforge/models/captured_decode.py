"""One decode step of `generate` — the model's forward over one new token per row, through its
key/value cache, and the output layer — captured once in a CUDA graph and replayed for every
new token. Launched from Python, an 8B model's step is some thousand kernels, whose launching
took longer than the GPU needs to read the weights; a replay launches them all at once.

A step that cannot be captured decodes eagerly, as before: on the CPU; for a model sharded by
FSDP2 (whose hooks gather weights through collectives); for mixture-of-experts blocks (which
route on the host); and wherever the capture itself fails (said once in the log)."""

import logging
from collections.abc import Callable

import torch

from tuneforge.models.decoder import Decoder
from tuneforge.models.kv_cache import KVCache
from tuneforge.packed import PackedSequences

log = logging.getLogger(__name__)

DecodeStep = Callable[[torch.Tensor], torch.Tensor]
"""[rows] new token ids -> [rows, vocab] fp32 logits of the tokens after them (the cache moved on)."""

_said_why: set[str] = set()


@torch.no_grad()  # as `generate` calls it: a capture under autograd records other kernels
def decode_step(model: Decoder, cache: KVCache) -> DecodeStep:
    """The decode step for `cache`'s rows: captured where it can be, else eager."""
    reason = why_not_captured(model, cache.lengths.device)
    if reason is None:
        try:
            return CapturedDecode(model, cache)
        except RuntimeError as error:  # an operation the capture does not allow
            reason = f"the capture failed ({str(error).splitlines()[0]})"
    if cache.lengths.device.type == "cuda" and reason not in _said_why:
        _said_why.add(reason)
        log.info("decoding without a CUDA graph: %s", reason)
    return EagerDecode(model, cache)


def why_not_captured(model: Decoder, device: torch.device) -> str | None:
    """Why `model`'s decode steps on `device` are launched eagerly; None where they are not."""
    from torch.distributed.fsdp import FSDPModule

    if device.type != "cuda":
        return "not on a CUDA device"
    if model.embed.weight.device != device:
        return "the embedding is kept in host memory"
    if model.args.moe is not None:
        return "mixture-of-experts blocks route on the host"
    if any(isinstance(module, FSDPModule) for module in model.modules()):
        return "FSDP2 gathers the weights through collectives"
    return None


class EagerDecode:
    def __init__(self, model: Decoder, cache: KVCache) -> None:
        self.model, self.cache = model, cache
        rows = cache.lengths.shape[0]
        self.cu_seqlens = torch.arange(rows + 1, dtype=torch.int32, device=cache.lengths.device)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        step = PackedSequences(self.cu_seqlens, 1, self.cache.lengths.clone())
        return self.model.lm_head(self.model.hidden_states(ids, step, self.cache)).float()


class CapturedDecode:
    """The step recorded on the cache's tensors, its input and output in fixed buffers."""

    def __init__(self, model: Decoder, cache: KVCache) -> None:
        self.model, self.cache = model, cache
        device = cache.lengths.device
        rows = cache.lengths.shape[0]
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros_like(cache.lengths)
        cu_seqlens = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.step = PackedSequences(cu_seqlens, 1, self.positions)
        before = cache.lengths.clone()
        # once eagerly on a side stream, as CUDA graphs want: lazy allocations and kernel
        # choices happen outside the capture (it writes where the first real step writes next)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._forward()
        torch.cuda.current_stream(device).wait_stream(side)
        cache.lengths.copy_(before)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.logits = self._forward()
        finally:
            cache.lengths.copy_(before)

    def _forward(self) -> torch.Tensor:
        self.positions.copy_(self.cache.lengths)
        hidden = self.model.hidden_states(self.ids, self.step, self.cache)
        return self.model.lm_head(hidden).float()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """The logits of a fixed buffer, overwritten by the next call."""
        self.ids.copy_(ids)
        self.graph.replay()
        return self.logits
