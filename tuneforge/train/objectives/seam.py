"""The objective seam: an objective turns a batch into a loss and metrics. The step and the loop
know only this. A batch is read from the loader, or made by the objective itself
(`Objective.make_batch`, e.g. a rollout); next-token SFT is one objective, and the others live
beside it in this package, each one module.

An objective is the module that DDP and FSDP2 wrap, so that the whole computation (the output
layer's weight included) runs inside the wrapper."""

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.packed import to_device
from tuneforge.parallel.distributed import unwrap


class ObjectiveOutput(NamedTuple):
    loss_sum: torch.Tensor
    """0-d: the sum of the batch's per-unit losses; the step divides by the units of all its
    micro-batches on every rank."""
    aux: torch.Tensor
    """0-d: a regulariser added once per micro-batch (the MoE load-balancing loss, or 0)."""
    metrics: dict[str, torch.Tensor]
    """0-d sums over the batch's units, reported per unit with the step's loss."""
    token_loss_sum: torch.Tensor | None = None
    """0-d, where the loss has a second term summed over supervised tokens (a preference loss's
    chosen-reply cross-entropy): the step divides it by the `token_units` of all its
    micro-batches on every rank, as it divides SFT's loss."""


@dataclass(frozen=True)
class Metric:
    """One of an objective's metrics and how people are shown it."""

    name: str
    percent: bool = False
    """Shown as a percentage (an accuracy); otherwise with four decimals."""
    headline: bool = False
    """Shown on each evaluation's line, beside the held-out loss, and on each step's."""
    per: str | None = None
    """What its sum is divided by: the objective's units (None), another metric's sum (its
    name), or nothing (`step`: a count per step)."""
    held_out: bool = True
    """Reported for held-out batches too (False: it describes training steps only)."""

    def format(self, value: float) -> str:
        return f"{value:.1%}" if self.percent else f"{value:.4f}"

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")


class Objective(nn.Module, ABC):
    """`objective(batch)` -> `ObjectiveOutput`; `units(batch)` counts what the loss is summed
    over, on the host (supervised tokens for SFT)."""

    metrics: tuple[Metric, ...] = ()
    """The keys of `ObjectiveOutput.metrics`, in a fixed order for the step's reductions."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model
        self.every_row_loss = False
        """Training batches have fixed shapes (a captured step): every row is projected to the
        vocabulary, the ignored ones weighted 0, so that no shape depends on the labels;
        evaluation, which runs eagerly, projects the supervised rows only."""

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(metric.name for metric in self.metrics)

    @abstractmethod
    def units(self, batch: PackedBatch) -> int: ...

    def token_units(self, batch: PackedBatch) -> torch.Tensor | int:
        """What `ObjectiveOutput.token_loss_sum` is summed over (0 without that term); a count
        on the device may stand here, so that the step does not wait for it."""
        return 0

    @abstractmethod
    def forward(self, batch: PackedBatch) -> ObjectiveOutput: ...

    def reads_batch(self) -> bool:
        """Whether the next micro-batch reads one from the loader (an objective that trains on
        its own batches again, GRPO's `num_iterations`, reads none meanwhile)."""
        return True

    def make_batch(
        self, read: PackedBatch | None, read_more: Callable[[], PackedBatch] | None = None
    ) -> PackedBatch:
        """The batch a step trains on, from the one read from the loader (None where
        `reads_batch` said no): the same, unless the objective makes its own (sampled
        completions of the read prompts; `read_more` reads further ones, for dynamic
        sampling)."""
        assert read is not None
        return read

    def resume_state(self) -> dict[str, Any]:
        """What a resume needs beyond the weights and the optimizer (JSON values), kept with
        each checkpoint's loop state and handed back to the objective's builder."""
        return {}


def step_units(
    objective: Objective, micro_batches: list[PackedBatch], device: torch.device
) -> torch.Tensor:
    """float64 [2] on `device`: the micro-batches' units and token units, summed without
    waiting for the device."""
    host = [float(sum(objective.units(batch) for batch in micro_batches)), 0.0]
    on_device = []
    for batch in micro_batches:
        count = objective.token_units(batch)
        if isinstance(count, torch.Tensor):
            on_device.append(count)
        else:
            host[1] += count
    total = to_device(torch.tensor(host, dtype=torch.float64), device)
    for count in on_device:
        total[1] += count.to(device=total.device, dtype=torch.float64)
    return total


def loss_value(loss_sum: float, token_loss_sum: float, units: float, token_units: float) -> float:
    """The loss of sums over a step (or a held-out pass): per unit, plus the token term per
    token where there is one."""
    loss = loss_sum / max(units, 1)
    return loss + token_loss_sum / token_units if token_units else loss


def metric_values(
    metrics: tuple[Metric, ...], sums: dict[str, float], units: float
) -> dict[str, float | None]:
    """Each metric's value from the sums over a step's (or a held-out pass's) batches: divided by
    the units, by another metric's sum, or left a count; None where that divisor is 0."""
    values: dict[str, float | None] = {}
    for metric in metrics:
        if metric.per == "step":
            values[metric.name] = sums[metric.name]
            continue
        divisor = units if metric.per is None else sums[metric.per]
        values[metric.name] = sums[metric.name] / divisor if divisor else None
    return values


def objective_of(module: nn.Module) -> Objective:
    """The objective inside a DDP wrapper (FSDP2 keeps the module itself)."""
    inner = unwrap(module)
    assert isinstance(inner, Objective), type(inner)
    return inner


def hidden_states_and_aux(model: Decoder, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The trained model's last hidden states of `batch` and its MoE load-balancing loss (0
    for a dense model; over the real tokens only, not the padding at the end). Router logits
    are kept for the loss during this forward only, however it is left."""
    model.record_router_logits(True)
    try:
        hidden = model.hidden_states(batch.tokens, batch.packed)
        aux = model.aux_loss(batch.real_tokens)
    finally:
        model.record_router_logits(False)
    return hidden, aux if aux is not None else hidden.new_zeros((), dtype=torch.float32)
