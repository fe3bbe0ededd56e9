"""Applied to the model's blocks from outside, before any parallel wrapping: `torch.compile` per
block, activation checkpointing (every block, or every k-th), optionally with the kept input
in host memory, blocks whose saved activations wait in host memory instead, and the last
checkpointed blocks keeping theirs on the GPU where memory is left. The checkpoint
wraps the compiled forward, so the recomputation runs compiled too. Module names, and so
checkpoints, stay unchanged."""

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from tuneforge.config.sections.train import TrainSection
from tuneforge.errors import TuneforgeError
from tuneforge.execution.activation_offload import offloaded_activations
from tuneforge.execution.offloaded_checkpoints import OffloadChain, offloaded_checkpoint
from tuneforge.models.args import ModelArgs
from tuneforge.models.decoder import Decoder
from tuneforge.plan.policies import offloaded_blocks, recomputed_blocks


@dataclass(frozen=True)
class BlockWrapping:
    """How each block is wrapped: compiled (`compile`; the compiled graph keeps at most
    `memory_budget` of what it could keep for backward; with `autotune` its matrix products
    are timed against Inductor's Triton templates); the saved activations of
    `offload_activations` blocks kept in pinned host memory; the blocks `checkpointing` picks
    (every `every`-th for `selective`) among the others recomputed but the last
    `keep_activations`, their inputs kept in pinned host memory with `offload`."""

    checkpointing: str = "none"
    every: int = 2
    compile: bool = False
    offload: bool = False
    memory_budget: float = 1.0
    offload_activations: int = 0
    keep_activations: int = 0
    autotune: bool = False

    @classmethod
    def of(cls, train: TrainSection) -> "BlockWrapping":
        return cls(
            checkpointing=train.activation_checkpointing,
            every=train.checkpoint_every,
            compile=train.compile,
            offload=train.offload_checkpoints,
            memory_budget=train.compile_memory_budget,
            offload_activations=train.offload_activations,
            keep_activations=train.keep_activations,
        )


def wrap_blocks(model: Decoder, wrapping: BlockWrapping) -> None:
    layers, w = len(model.layers), wrapping
    recomputed = recomputed_blocks(
        layers, w.checkpointing, w.every, w.offload_activations, w.keep_activations
    )
    offloaded = set(offloaded_blocks(layers, w.offload_activations))
    chain = OffloadChain()
    for index, layer in enumerate(model.layers):
        forward = layer.forward
        if w.compile:
            forward = compiled(forward, w.memory_budget, w.autotune)
        if index in offloaded:
            forward = offloaded_activations(forward, layer, chain)
        elif index in recomputed and w.offload:
            params = [p for p in layer.parameters() if p.requires_grad]
            forward = offloaded_checkpoint(forward, params, chain)
        elif index in recomputed:
            forward = functools.partial(checkpoint, forward, use_reentrant=False)
        layer.forward = forward


def compiled(forward: Callable, memory_budget: float = 1.0, autotune: bool = False) -> Callable:
    """`torch.compile(forward)`; with `memory_budget` below 1, the partition of forward and
    backward keeps that share of the activations and recomputes cheap values (elementwise
    results such as norm outputs and the SwiGLU product) in backward instead
    (torch's `activation_memory_budget`, read when the graph is first compiled). With
    `autotune`, each matrix product in the graph (the experts' grouped GEMMs among them; the
    adapters' operators are opaque to it) runs the fastest of cuBLAS/CUTLASS and Inductor's
    Triton templates, timed when the graph is compiled."""
    run = torch.compile(forward, options={"max_autotune_gemm": True} if autotune else None)
    if memory_budget >= 1.0:
        return run

    def run_within_budget(*args, **kwargs):
        with torch._functorch.config.patch(activation_memory_budget=memory_budget):
            return run(*args, **kwargs)

    return run_within_budget


def refuse_unsupported_offload(train: TrainSection, world_size: int, args: ModelArgs) -> None:
    if train.offload_activations > args.num_layers:
        raise TuneforgeError(
            f"train.offload_activations is {train.offload_activations} but the model has "
            f"{args.num_layers} blocks: lower it"
        )
    for name in ("offload_activations", "offload_checkpoints"):
        if getattr(train, name) and world_size > 1:
            raise TuneforgeError(f"train.{name} runs on one process; drop it with DDP or FSDP")
    if train.offload_checkpoints and args.moe is not None and args.moe.router_aux_loss_coef > 0:
        raise TuneforgeError(
            "train.offload_checkpoints cannot carry the gradient of the MoE router's aux loss: "
            "drop it and keep plain checkpointing for this model"
        )
