"""One optimizer step: forward and backward of its micro-batches, the loss normalised by the
supervised tokens of the whole step on every rank, clipping, and the update unless non-finite."""

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
) -> dict[str, Any]:
    """Run one step at learning rate `lr`; its loss, gradient norm and token counts."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    embedding = model.embed.weight.device  # the host with train.offload_embedding
    micro_batches = [next(batches).to(device, embedding) for _ in range(train.grad_accum_steps)]
    # Normalise by the supervised tokens of the whole step on every rank: any split of the same
    # tokens over micro-batches and ranks gives the same update. DDP and FSDP average gradients
    # over ranks, hence the factor world_size.
    # The sum stays on the device (no wait for the GPU before the forward is queued).
    distributed = torch.distributed.is_initialized()
    world_size = torch.distributed.get_world_size() if distributed else 1
    local_tokens = sum(batch.num_loss_tokens for batch in micro_batches)
    token_total = to_device(torch.tensor([float(local_tokens)], dtype=torch.float64), device)
    if distributed:
        torch.distributed.all_reduce(token_total)
    scale = (world_size / token_total.clamp(min=1)).float().squeeze(0)
    moe = model.args.moe
    local_loss = backward_micro_batches(
        objective, micro_batches, scale, moe.router_aux_loss_coef if moe is not None else 0.0
    )
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = train.clip_grad_norm if train.clip_grad_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    # One wait for the GPU per step: the loss and the norm read together (with the token
    # counts, summed over ranks by the same all-reduce as the loss).
    counts = [
        float(sum(b.num_real_tokens for b in micro_batches)),
        float(sum(b.packed.cu_seqlens.numel() - 1 for b in micro_batches)),
    ]
    totals = local_loss.reshape(1)
    if distributed:
        totals = torch.cat([totals, torch.tensor(counts, dtype=torch.float64, device=device)])
        torch.distributed.all_reduce(totals)
    norm = norm.detach().reshape(1).to(torch.float64)
    values = torch.cat([totals, norm, token_total]).tolist()
    loss_sum, *reduced, grad_norm, step_tokens = values
    real, documents = reduced or counts
    loss = loss_sum / max(step_tokens, 1)
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "finite": finite,
        "tokens": int(real),
        "loss_tokens": int(step_tokens),
        "mean_doc_len": real / max(documents, 1),
    }
