"""One optimizer step: forward and backward of its micro-batches, the loss normalised by the
supervised tokens of the whole step on every rank, clipping, and the update unless non-finite —
queued without waiting for the GPU where the optimizer can skip a non-finite update itself."""

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from tuneforge.config.schema import TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.models.packed import to_device
from tuneforge.train.objective import backward_micro_batches


def optimizer_step(
    objective: nn.Module,
    model: Decoder,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[PackedBatch],
    train: TrainSection,
    lr: float,
    device: torch.device,
) -> "StepResult":
    """Queue one step at learning rate `lr`; its loss, gradient norm and token counts come with
    `get()` on the result."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    embedding = model.embed.weight.device  # the host with train.offload_embedding
    micro_batches = [next(batches).to(device, embedding) for _ in range(train.grad_accum_steps)]
    # The sum stays on the device (no wait for the GPU before the forward is queued).
    token_total = to_device(loss_token_count(micro_batches), device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(token_total)
    counts = step_counts(micro_batches)
    values = queue_update(objective, model, optimizer, micro_batches, token_total, train, counts)
    return StepResult(values_to_host(values), lr, counts)


def loss_token_count(micro_batches: list[PackedBatch]) -> torch.Tensor:
    """The supervised tokens of this rank's micro-batches, float64 [1] on the host."""
    local = sum(batch.num_loss_tokens for batch in micro_batches)
    return torch.tensor([float(local)], dtype=torch.float64)


def step_counts(micro_batches: list[PackedBatch]) -> list[float]:
    """[real tokens, documents] of this rank's micro-batches."""
    return [
        float(sum(b.num_real_tokens for b in micro_batches)),
        float(sum(b.num_documents for b in micro_batches)),
    ]


def queue_update(
    objective: nn.Module,
    model: Decoder,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[PackedBatch],
    token_total: torch.Tensor,
    train: TrainSection,
    counts: list[float],
) -> torch.Tensor:
    """Forward and backward of the micro-batches, clipping, the update and zeroed gradients;
    returns [loss sum, (real tokens, documents: summed over ranks), gradient norm, supervised
    tokens] on the device. Nothing here waits for the GPU where the optimizer skips non-finite
    updates itself, so the whole of it can also be captured as a CUDA graph."""
    # Normalise by the supervised tokens of the whole step on every rank (`token_total`, summed
    # over ranks): any split of the same tokens over micro-batches and ranks gives the same
    # update. DDP and FSDP average gradients over ranks, hence the factor world_size.
    distributed = torch.distributed.is_initialized()
    world_size = torch.distributed.get_world_size() if distributed else 1
    scale = (world_size / token_total.clamp(min=1)).float().squeeze(0)
    moe = model.args.moe
    local_loss = backward_micro_batches(
        objective, micro_batches, scale, moe.router_aux_loss_coef if moe is not None else 0.0
    )
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = train.clip_grad_norm if train.clip_grad_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    totals = local_loss.reshape(1)
    if distributed:  # the token counts summed over ranks by the same all-reduce as the loss
        totals = torch.cat([totals, torch.tensor(counts, dtype=torch.float64, device=norm.device)])
        torch.distributed.all_reduce(totals)
    norm = norm.detach().reshape(1).to(torch.float64)
    values = torch.cat([totals, norm, token_total])
    if skips_on_device(optimizer):
        # The update is skipped by the optimizer's kernel when the loss or the norm is not
        # finite, so nothing waits for the GPU here: the host goes on to queue the next step.
        optimizer.found_inf = _not_finite(totals[0], norm[0], params)
        optimizer.step()
    elif all(math.isfinite(value) for value in values.tolist()):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return values


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Fused Adam and AdamW take a `found_inf` flag and skip their update (step count too). Read
    per group: a resumed optimizer state brings its groups' settings along."""
    return all(group.get("fused") for group in optimizer.param_groups)


def _not_finite(loss_sum: torch.Tensor, norm: torch.Tensor, params: list) -> torch.Tensor:
    flag = (~(torch.isfinite(loss_sum) & torch.isfinite(norm))).float()
    if params and hasattr(params[0], "device_mesh"):  # FSDP2: the optimizer sees DTensors
        from torch.distributed.tensor import DTensor, Replicate

        mesh = params[0].device_mesh
        flag = DTensor.from_local(flag, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return flag


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


class StepResult:
    """A queued step's loss, gradient norm and token counts. `get()` waits for the GPU only up to
    the end of that step's backward (the update may still run), so the trainer reads a step's
    numbers after queueing the next one: the GPU never idles between steps."""

    def __init__(self, values: HostValues, lr: float, counts: list[float]) -> None:
        self._values = values
        self._lr, self._counts = lr, counts
        self._resolved: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self._resolved is None:
            loss_sum, *reduced, grad_norm, step_tokens = read_host_values(self._values)
            real, documents = reduced or self._counts
            loss = loss_sum / max(step_tokens, 1)
            self._resolved = {
                "loss": loss,
                "lr": self._lr,
                "grad_norm": grad_norm,
                "finite": math.isfinite(loss) and math.isfinite(grad_norm),
                "tokens": int(real),
                "loss_tokens": int(step_tokens),
                "mean_doc_len": real / max(documents, 1),
            }
        return self._resolved
