"""The whole optimizer step (forward, backward, clipping, the update) captured once as a CUDA
graph and replayed for every later step: the host queues one launch per step instead of
thousands of kernels, so the GPU never waits for Python.

A graph replays fixed shapes and kernel arguments, so every micro-batch is brought to the same
shape first (`data.fixed_shape`): the step's tokens, and document slots for the most documents
seen so far (a power of two; a batch with more documents makes a new graph). The loss then
projects every row, the ignored ones weighted 0, instead of picking the supervised rows. The
batch, the learning rate and the token count are copied into the graph's own input tensors
before each replay. Warm-up steps run the same code eagerly (torch.compile and the attention
kernels compile there, and the optimizer creates its state), then one step is captured and
replayed; every call is a real training step.

Needs one CUDA GPU, fused AdamW (it skips non-finite updates itself) and everything on the GPU
(no offloading to host memory); `captured_step_blockers` says what stands in the way. The step
itself (`update`) comes from the recipe: this module only captures and replays it."""

import logging
from collections.abc import Callable

import torch

from tuneforge.config.sections.train import TrainSection
from tuneforge.data.fixed_shape import documents_needed, to_fixed_shape
from tuneforge.data.packing import PackedBatch
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import GIB
from tuneforge.models.decoder import Decoder

log = logging.getLogger(__name__)

EAGER_STEPS = 2
"""Steps run eagerly before each capture: compilation and lazy initialisation happen there."""
MIN_DOCUMENT_SLOTS = 8
CAPTURABLE_ATTENTION = ("flash4", "varlen")

Update = Callable[[list[PackedBatch], torch.Tensor], torch.Tensor]
"""(micro-batches on the device, the step's units and token units [2] on the device) -> the
step's numbers on the device, queueing forward, backward and the update without a host wait."""
Units = Callable[[list[PackedBatch], torch.device], torch.Tensor]
"""What the step's loss is normalised by, for its micro-batches: [units, token units] float64
on the device."""


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Fused Adam and AdamW take a `found_inf` flag and skip their update (step count too). Read
    per group: a resumed optimizer state brings its groups' settings along."""
    return all(group.get("fused") for group in optimizer.param_groups)


def captured_step_blockers(
    model: Decoder, optimizer: torch.optim.Optimizer, train: TrainSection
) -> list[str]:
    """Why the step cannot be captured here (empty: it can)."""
    blockers = []
    if model.embed.weight.device.type != "cuda":
        blockers.append("the model is not on a CUDA GPU (or its embedding is in host memory)")
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        blockers.append("more than one process (FSDP2 and DDP steps are not captured)")
    if not skips_on_device(optimizer):
        blockers.append("the optimizer is not fused AdamW")
    if train.offload_checkpoints or train.offload_activations:
        blockers.append("offloading to host memory (offload_checkpoints, offload_activations)")
    backends = {block.attn.backend for block in model.blocks}
    if not backends <= set(CAPTURABLE_ATTENTION):
        blockers.append(
            f"attention {sorted(backends)} reads document lengths on the host; "
            f"use {' or '.join(CAPTURABLE_ATTENTION)}"
        )
    return blockers


class CapturedStep:
    """`step(micro_batches, lr)` queues `update` for them at learning rate `lr` and returns its
    numbers on the device: eagerly for the first steps of each shape, then as a graph replay."""

    def __init__(
        self,
        update: Update,
        units: Units,
        model: Decoder,
        optimizer: torch.optim.Optimizer,
        train: TrainSection,
        device: torch.device,
    ) -> None:
        blockers = captured_step_blockers(model, optimizer, train)
        if blockers:
            raise TuneforgeError(
                "train.cuda_graph: " + "; ".join(blockers) + ": drop train.cuda_graph"
            )
        self.update, self.units = update, units
        self.model, self.optimizer = model, optimizer
        self.train, self.device = train, device
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        """The learning rate the captured update kernel reads on the device."""
        self.unit_total = torch.zeros(2, dtype=torch.float64, device=device)
        """The step's units and token units, which the captured update reads on the device."""
        self.side_stream = torch.cuda.Stream(device)
        self.slots = 0
        self.inputs: list[PackedBatch] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.values: torch.Tensor | None = None
        self.eager_steps_left = EAGER_STEPS
        self.peak_allocated = 0
        """Bytes allocated at the captured step's peak (replays allocate nothing)."""

    def __call__(self, micro_batches: list[PackedBatch], lr: float) -> torch.Tensor:
        tokens = self.train.tokens_per_micro_batch
        needed = max(documents_needed(batch, tokens) for batch in micro_batches)
        if needed > self.slots:
            self._start_over(max(MIN_DOCUMENT_SLOTS, 1 << (needed - 1).bit_length()))
        for group in self.optimizer.param_groups:  # for the eager steps and the state dict
            group["lr"] = lr
        self._load([to_fixed_shape(batch, tokens, self.slots) for batch in micro_batches], lr)
        if self.eager_steps_left:
            self.eager_steps_left -= 1
            return self._run_eagerly()
        if self.graph is None:
            self._capture()
        assert self.graph is not None and self.values is not None
        self.graph.replay()
        return self.values

    def _start_over(self, slots: int) -> None:
        if self.graph is not None:
            log.info("a batch of more documents than %d: the step is captured again", self.slots)
        self.slots, self.inputs, self.graph, self.values = slots, None, None, None
        self.eager_steps_left = EAGER_STEPS

    def _load(self, micro_batches: list[PackedBatch], lr: float) -> None:
        self.lr.fill_(lr)
        self.unit_total.copy_(self.units(micro_batches, self.device))
        if self.inputs is None:
            self.inputs = [batch.to(self.device) for batch in micro_batches]
            return
        for static, batch in zip(self.inputs, micro_batches, strict=True):
            assert static.real_tokens is not None and batch.real_tokens is not None  # fixed shape
            for target, source in (
                (static.tokens, batch.tokens),
                (static.labels, batch.labels),
                (static.packed.cu_seqlens, batch.packed.cu_seqlens),
                (static.packed.position_ids, batch.packed.position_ids),
                (static.real_tokens, batch.real_tokens),
            ):
                target.copy_(source.pin_memory(), non_blocking=True)

    def _update(self) -> torch.Tensor:
        assert self.inputs is not None
        return self.update(self.inputs, self.unit_total)

    def _run_eagerly(self) -> torch.Tensor:
        # on a side stream, as torch.cuda.graph's warm-up asks
        side, current = self.side_stream, torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            values = self._update()
        current.wait_stream(side)
        return values

    def _capture(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # the eager steps' cached blocks: the graph gets its own pool
        torch.cuda.reset_peak_memory_stats(self.device)
        self.graph = torch.cuda.CUDAGraph()
        groups = self.optimizer.param_groups
        saved = [(group["lr"], group["capturable"]) for group in groups]
        for group in groups:  # only while capturing: the state dict keeps plain settings
            group["lr"], group["capturable"] = self.lr, True
        try:
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.values = self._update()
        finally:
            for group, (lr, capturable) in zip(groups, saved, strict=True):
                group["lr"], group["capturable"] = lr, capturable
        self.peak_allocated = torch.cuda.max_memory_allocated(self.device)
        log.info(
            "step captured as a CUDA graph: %d tokens in %d document slots per micro-batch, "
            "%.2f GiB at its peak",
            self.train.tokens_per_micro_batch,
            self.slots,
            self.peak_allocated / GIB,
        )
