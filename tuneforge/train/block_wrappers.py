"""Applied to the model's blocks from outside, before any parallel wrapping: `torch.compile` per
block and activation checkpointing (every block, or every k-th), optionally with the kept input
in host memory. The checkpoint wraps the compiled forward, so the recomputation runs compiled
too. Module names, and so checkpoints, stay unchanged."""

import functools

import torch
from torch.utils.checkpoint import checkpoint

from tuneforge.config.schema import TrainSection
from tuneforge.errors import TuneforgeError
from tuneforge.models.args import ModelArgs
from tuneforge.models.decoder import Decoder
from tuneforge.train.offload import offloaded_checkpoint


def checkpointed_blocks(num_layers: int, mode: str, every: int = 2) -> list[int]:
    """Indexes of the blocks whose activations are recomputed: all (`full`), blocks k, 2k, ...
    counted from 1 (`selective`), or none."""
    if mode == "full":
        return list(range(num_layers))
    if mode == "selective":
        return [index for index in range(num_layers) if (index + 1) % every == 0]
    return []


def wrap_blocks(
    model: Decoder,
    checkpointing: str = "none",
    every: int = 2,
    compile: bool = False,
    offload: bool = False,
) -> None:
    """Compile each block's forward (`compile`), then checkpoint the chosen blocks around it,
    keeping their inputs in pinned host memory with `offload`."""
    checkpointed = set(checkpointed_blocks(len(model.layers), checkpointing, every))
    for index, layer in enumerate(model.layers):
        forward = torch.compile(layer.forward) if compile else layer.forward
        if index in checkpointed and offload:
            params = [p for p in layer.parameters() if p.requires_grad]
            forward = offloaded_checkpoint(forward, params)
        elif index in checkpointed:
            forward = functools.partial(checkpoint, forward, use_reentrant=False)
        layer.forward = forward


def refuse_unsupported_offload(train: TrainSection, world_size: int, args: ModelArgs) -> None:
    if not train.offload_checkpoints:
        return
    where = "train.offload_checkpoints"
    if world_size > 1:
        raise TuneforgeError(f"{where} runs on one process; drop it with DDP or FSDP")
    if args.moe is not None and args.moe.router_aux_loss_coef > 0:
        raise TuneforgeError(
            f"{where} cannot carry the gradient of the MoE router's aux loss: drop it and "
            "keep plain checkpointing for this model"
        )
