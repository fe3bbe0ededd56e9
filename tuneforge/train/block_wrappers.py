"""Applied to the model's blocks from outside, before any parallel wrapping: activation
checkpointing (every block, or every k-th) and `torch.compile` per block. Module names, and so
checkpoints, stay unchanged."""

import functools

from torch.utils.checkpoint import checkpoint

from tuneforge.models.decoder import Decoder


def checkpointed_blocks(num_layers: int, mode: str, every: int = 2) -> list[int]:
    """Indexes of the blocks whose activations are recomputed: all (`full`), blocks k, 2k, ...
    counted from 1 (`selective`), or none."""
    if mode == "full":
        return list(range(num_layers))
    if mode == "selective":
        return [index for index in range(num_layers) if (index + 1) % every == 0]
    return []


def apply_activation_checkpointing(model: Decoder, mode: str = "full", every: int = 2) -> None:
    for index in checkpointed_blocks(len(model.layers), mode, every):
        layer = model.layers[index]
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)


def compile_blocks(model: Decoder) -> None:
    for layer in model.layers:
        layer.compile()
