"""One optimizer step: forward and backward of its micro-batches through the objective, the loss
normalised by the objective's units (supervised tokens for SFT) of the whole step on every rank,
clipping, and the update unless non-finite — queued without waiting for the GPU where the
optimizer can skip a non-finite update itself."""

import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed import ProcessGroup

from tuneforge.config.sections.train import TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.execution.captured_step import CapturedStep, skips_on_device
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import gradient_sync
from tuneforge.parallel.grad_norm import clip_grad_norm
from tuneforge.train.host_values import HostValues, Mark, read_host_values, values_to_host
from tuneforge.train.objectives.seam import (
    Metric,
    loss_value,
    metric_values,
    objective_of,
    step_units,
)


def optimizer_step(
    objective: torch.nn.Module,
    model: Decoder,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[PackedBatch],
    train: TrainSection,
    lr: float,
    device: torch.device,
    data_group: ProcessGroup | None = None,
) -> "StepResult":
    """Queue one step at learning rate `lr`; its loss, metrics, gradient norm and token counts
    come with `get()` on the result. `data_group`: the ranks that read different data, where
    not all do (tensor-parallel ranks read the same)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    embedding = model.embed.weight.device  # the host with train.offload_embedding
    inner = objective_of(objective)

    def read() -> PackedBatch:
        return next(batches).to(device, embedding)

    micro_batches = [
        inner.make_batch(read() if inner.reads_batch() else None, read)
        for _ in range(train.grad_accum_steps)
    ]
    # The sums stay on the device (no wait for the GPU before the forward is queued).
    unit_total = step_units(inner, micro_batches, device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(unit_total, group=data_group)
    counts = step_counts(micro_batches)
    values = queue_update(
        objective, model, optimizer, micro_batches, unit_total, train, counts, data_group
    )
    return StepResult(values_to_host(values), lr, counts, inner.metrics)


def step_counts(micro_batches: list[PackedBatch]) -> list[float]:
    """[real tokens, documents] of this rank's micro-batches."""
    return [
        float(sum(b.num_real_tokens for b in micro_batches)),
        float(sum(b.num_documents for b in micro_batches)),
    ]


def queue_update(
    objective: torch.nn.Module,
    model: Decoder,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[PackedBatch],
    unit_total: torch.Tensor,
    train: TrainSection,
    counts: list[float],
    data_group: ProcessGroup | None = None,
) -> torch.Tensor:
    """Forward and backward of the micro-batches, clipping, the update and zeroed gradients;
    returns [loss sum, token loss sum, *metric sums, (real tokens, documents: summed over ranks),
    gradient norm, units, token units] on the device. Nothing here waits for the GPU where the
    optimizer skips non-finite updates itself, so the whole of it can also be captured as a CUDA
    graph."""
    # Normalise by the units of the whole step on every rank (`unit_total`, summed over ranks):
    # any split of the same units over micro-batches and ranks gives the same update. DDP and
    # FSDP average gradients over the data-parallel ranks, hence the factor of their number.
    distributed = torch.distributed.is_initialized()
    ranks = torch.distributed.get_world_size(data_group) if distributed else 1
    scale = (ranks / unit_total.clamp(min=1)).float()
    moe = model.args.moe
    local_sums = backward_micro_batches(
        objective,
        micro_batches,
        scale[0],
        moe.router_aux_loss_coef if moe is not None else 0.0,
        objective_of(objective).metric_names,
        scale[1],
    )
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = train.clip_grad_norm if train.clip_grad_norm is not None else float("inf")
    norm = clip_grad_norm(params, max_norm)
    totals = local_sums
    if distributed:  # the token counts summed over ranks by the same all-reduce as the loss
        totals = torch.cat([totals, torch.tensor(counts, dtype=torch.float64, device=norm.device)])
        torch.distributed.all_reduce(totals, group=data_group)
    norm = norm.detach().reshape(1).to(torch.float64)
    values = torch.cat([totals, norm, unit_total])
    if skips_on_device(optimizer):
        # The update is skipped by the optimizer's kernel when the loss or the norm is not
        # finite, so nothing waits for the GPU here: the host goes on to queue the next step.
        setattr(optimizer, "found_inf", _not_finite(totals[:2], norm[0], params))  # noqa: B010
        optimizer.step()
    elif all(math.isfinite(value) for value in values.tolist()):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return values


def _not_finite(loss_sums: torch.Tensor, norm: torch.Tensor, params: list) -> torch.Tensor:
    flag = (~(torch.isfinite(loss_sums).all() & torch.isfinite(norm))).float()
    if params and hasattr(params[0], "device_mesh"):  # FSDP2: the optimizer sees DTensors
        from torch.distributed.tensor import DTensor, Replicate

        mesh = params[0].device_mesh
        flag = DTensor.from_local(flag, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return flag


class StepResult:
    """A queued step's loss, metrics, gradient norm and token counts. `get()` waits for the GPU
    only up to the end of that step's backward (the update may still run), so the trainer reads
    a step's numbers after queueing the next one: the GPU never idles between steps."""

    def __init__(
        self,
        values: HostValues,
        lr: float,
        counts: list[float],
        metrics: tuple[Metric, ...] = (),
    ) -> None:
        self._values = values
        self._lr, self._counts, self._metrics = lr, counts, metrics
        self._resolved: dict[str, Any] | None = None

    @property
    def done(self) -> Mark:
        """When the step's forward and backward finished, on the device's clock."""
        return self._values.done

    def get(self) -> dict[str, Any]:
        if self._resolved is None:
            values = read_host_values(self._values)
            count = len(self._metrics)
            loss_sum, token_loss_sum = values[0], values[1]
            metric_sums = values[2 : 2 + count]
            *reduced, grad_norm, units, token_units = values[2 + count :]
            real, documents = reduced or self._counts
            loss = loss_value(loss_sum, token_loss_sum, units, token_units)
            names = (metric.name for metric in self._metrics)
            sums = dict(zip(names, metric_sums, strict=True))
            metrics = metric_values(self._metrics, sums, max(units, 1))
            self._resolved = {
                "loss": loss,
                "lr": self._lr,
                "grad_norm": grad_norm,
                "finite": math.isfinite(loss) and math.isfinite(grad_norm),
                "tokens": int(real),
                "loss_tokens": int(units),
                "mean_doc_len": real / max(documents, 1),
                "metrics": metrics,
            }
        return self._resolved


class StepRunner:
    """`runner(batches, lr)` queues one optimizer step and returns its `StepResult`: eagerly, or
    captured once as a CUDA graph and replayed with `train.cuda_graph`."""

    def __init__(
        self,
        objective: torch.nn.Module,
        model: Decoder,
        optimizer: torch.optim.Optimizer,
        train: TrainSection,
        device: torch.device,
        data_group: ProcessGroup | None = None,
    ) -> None:
        self.objective, self.model, self.optimizer = objective, model, optimizer
        self.train, self.device, self.data_group = train, device, data_group
        inner = objective_of(objective)
        self.metrics = inner.metrics
        self.captured: CapturedStep | None = None
        if train.cuda_graph:
            update = functools.partial(
                queue_update, objective, model, optimizer, train=train, counts=[]
            )
            units = functools.partial(step_units, inner)
            self.captured = CapturedStep(update, units, model, optimizer, train, device)
            # fixed shapes: every row is projected to the vocabulary, the ignored ones weighted 0
            inner.every_row_loss = True

    def __call__(self, batches: Iterator[PackedBatch], lr: float) -> StepResult:
        if self.captured is None:
            return optimizer_step(
                self.objective,
                self.model,
                self.optimizer,
                batches,
                self.train,
                lr,
                self.device,
                self.data_group,
            )
        micro_batches = [next(batches) for _ in range(self.train.grad_accum_steps)]
        values = self.captured(micro_batches, lr)
        counts = step_counts(micro_batches)
        return StepResult(values_to_host(values), lr, counts, self.metrics)


def backward_micro_batches(
    objective: torch.nn.Module,
    micro_batches: list[PackedBatch],
    scale: float | torch.Tensor,
    aux_weight: float,
    metric_names: tuple[str, ...] = (),
    token_scale: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Backward of `scale x (sum of unit losses)` over the micro-batches, plus `token_scale x
    (sum of token losses)` where the objective has that term, plus the regulariser weighted by
    `aux_weight` and averaged over them; gradients are reduced across ranks on the last one
    only. Returns this rank's [loss sum, token loss sum, *metric sums], float64 on the device
    (reading it waits for the GPU: the caller does so once per step)."""
    device = micro_batches[0].labels.device
    total = torch.zeros(2 + len(metric_names), dtype=torch.float64, device=device)
    for index, batch in enumerate(micro_batches):
        with gradient_sync(objective, index == len(micro_batches) - 1):
            output = objective(batch)
            loss = output.loss_sum * scale
            if output.token_loss_sum is not None:
                loss = loss + output.token_loss_sum * token_scale
            if aux_weight:
                loss = loss + aux_weight * output.aux / len(micro_batches)
            loss.backward()
        total[0] += output.loss_sum.detach()  # one in-place add each, no stacking
        if output.token_loss_sum is not None:
            total[1] += output.token_loss_sum.detach()
        for slot, name in enumerate(metric_names, 2):
            total[slot] += output.metrics[name].detach()
    return total
