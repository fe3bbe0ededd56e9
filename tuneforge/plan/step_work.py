"""The work of one optimizer step on one GPU, counted in the units that bound each part: FLOPs of
GEMMs by the format they run in, attention FLOPs by kernel, bytes through memory, bytes over the
host link and the GPUs' links, and the host's launches. `plan/step_time.py` prices it.

Counted from the configuration, the model's shape and each micro-batch's document lengths, with
the rules the trainer applies (`plan/policies.py`: which blocks are recomputed or offloaded)."""

import math
from dataclasses import dataclass, field

from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    attention_flops_per_token,
    budget_share,
    expert_projection_shapes,
    forward_matmul_flops_per_token,
    lora_params,
)
from tuneforge.plan.base_weights import frozen_linears
from tuneforge.plan.memory import Setup, kept_bytes_per_token
from tuneforge.plan.policies import offloaded_blocks, recomputed_blocks

ELEMENTWISE_PASSES = 3
"""Each kept activation is written in forward, read in backward and its gradient written."""
LOSS_BYTES_PER_LOGIT = 12
"""Logits written, read for the softmax in fp32 and their gradient written."""
CHEAP_BUDGET = 0.8
"""The lowest compiled-block budget that recomputes elementwise work only (bench/RESULTS.md:
budgets 0.8 and 0.9 keep the same bytes; lower ones make products again)."""
DEQUANT_BYTES_PER_WEIGHT = 4.5
"""A 4-bit weight read (half a byte) and written and read again in 16 bits for its product."""


@dataclass(frozen=True)
class StepWork:
    gemm_flops: dict[str, float] = field(default_factory=dict)
    """By format: `bf16` (the model's dtype), `fp8`, `experts` (grouped), `adapters` (LoRA)."""
    attention_flops: float = 0.0
    attention_kernel: str = "flash"
    fp8_kernel: str = "tuneforge rowwise"
    """The FP8 GEMMs' implementation and scaling."""
    restored_blocks: float = 0.0
    """Blocks whose saved activations come back from host memory in backward."""
    memory_bytes: float = 0.0
    """Elementwise work, the loss's logits and the optimizer's reads and writes."""
    dequant_bytes: float = 0.0
    """A 4-bit base's weights read and dequantised (nonzero: its products run on them)."""
    host_bytes: tuple[float, float] = (0.0, 0.0)
    """(to host in forward, back in backward)."""
    forward_share: float = 0.5
    """The share of the GPU's compute in forward: what hides the transfers to host."""
    collective_bytes: dict[str, float] = field(default_factory=dict)
    """Data-parallel collectives (overlapped with compute) by name; `tp`/`ep` ones in line."""
    blocks_launched: float = 0.0
    """Block forward+backward launches on the host (compiled-block units)."""
    loss_chunks: int = 0
    compiled: bool = True
    """Blocks compiled (fused kernels) rather than run eagerly."""
    captured: bool = False
    """The step replays a CUDA graph: the host launches nothing per block."""


def _expert_forward_flops(args: ModelArgs) -> float:
    """Forward FLOPs per token of the routed experts (top-k of each MoE layer)."""
    if args.moe is None:
        return 0.0
    per_expert = sum(i * o for i, o in expert_projection_shapes(args).values())
    sparse = sum(args.is_sparse_layer(layer) for layer in range(args.num_layers))
    return 2.0 * sparse * args.moe.top_k * per_expert


def products_again(setup: Setup) -> float:
    """The share of a compiled block's forward products made again in backward under a memory
    budget below what dropping the cheap activations reaches (`models.cost.budget_share`)."""
    if not setup.compiled or setup.compile_memory_budget >= CHEAP_BUDGET:
        return 0.0
    floor = budget_share(CHEAP_BUDGET)
    return max(0.0, floor - budget_share(setup.compile_memory_budget)) / floor


@dataclass(frozen=True)
class TokenWork:
    """What a micro-batch costs whatever its documents: per token, and per micro-batch (the
    base's weights dequantised or normed once a pass, the blocks brought back from host
    memory); attention is counted by its lengths."""

    per_token: dict[str, float]
    per_micro_batch: dict[str, float]
    attention_passes: float
    """Attention's forwards and backwards, in forwards (3, and one more for a recomputed block
    or a frozen model's pass)."""
    forward: float
    """Forwards of every token: 1, and a frozen model's."""


def token_work(setup: Setup, fp8: str | None, dora: bool, frozen_forward_share: float) -> TokenWork:
    """`fp8`: the precision's FP8 recipe (None: none); `frozen_forward_share`: a frozen model's
    forward (a preference run's reference) over the trained model's own forward."""
    args = setup.rank_args
    layers = args.num_layers
    recomputed = recomputed_blocks(
        layers,
        setup.checkpointing,
        setup.checkpoint_every,
        setup.offload_activations,
        setup.keep_activations,
    )
    again = len(recomputed) / max(layers, 1)  # forwards run again in backward
    again += (1.0 - again) * products_again(setup)
    lora = setup.lora
    experts = _expert_forward_flops(args)
    head = 2.0 * args.vocab_size * args.dim
    blocks = forward_matmul_flops_per_token(args) - experts - head
    passes = 2.0 if lora is not None else 3.0  # forward, input gradient (and weight gradient)
    forward = 1.0 + frozen_forward_share
    block_passes = passes + again + frozen_forward_share
    per_token = {
        "bf16": head * (passes - 1 + forward),
        "fp8": 0.0,
        "experts": experts * block_passes,
        "adapters": 0.0,
    }
    per_token["fp8" if fp8 else "bf16"] += blocks * block_passes
    if lora is not None:
        active = lora_params(args, lora, active=True)
        per_token["adapters"] = 2.0 * active * (3.0 + again + frozen_forward_share)
    kept = sum(kept_bytes_per_token(setup, layer, "none") for layer in range(layers))
    budget_again = (1.0 - setup.compile_memory_budget) if setup.compiled else 0.0
    per_token["memory"] = kept * (ELEMENTWISE_PASSES + again + budget_again + frozen_forward_share)
    per_token["memory"] += args.vocab_size * LOSS_BYTES_PER_LOGIT * forward
    on_host = offloaded_blocks(layers, setup.offload_activations)
    moved = sum(kept_bytes_per_token(setup, layer, "none") for layer in on_host)
    if setup.offload_checkpoints:
        moved += len(recomputed) * args.dim * setup.param_bytes  # the blocks' inputs
    if setup.offload_embedding:
        moved += args.dim * setup.param_bytes
    per_token["host"] = moved
    per_token["forward"] = (blocks + experts + head) * forward
    per_micro_batch = {"restored": float(len(on_host))}  # blocks whose activations come back
    if dora and lora is not None:  # each adapted weight's norm, W + BA made per pass
        per_micro_batch["memory"] = frozen_linears(args)[0] * setup.param_bytes * 3 * (2 + again)
    if setup.base_weights.format.startswith("bnb"):
        per_micro_batch["dequant"] = (
            frozen_linears(args)[0] * DEQUANT_BYTES_PER_WEIGHT * (2 + again)
        )
    return TokenWork(per_token, per_micro_batch, 3.0 + again + frozen_forward_share, forward)


def micro_batch_work(setup: Setup, lengths: list[int], costs: TokenWork) -> dict[str, float]:
    """One micro-batch's FLOPs and bytes (before the step's fixed work)."""
    tokens = sum(lengths)
    work = {key: value * tokens for key, value in costs.per_token.items()}
    for key, value in costs.per_micro_batch.items():
        work[key] = work.get(key, 0.0) + value
    args = setup.rank_args
    attention = sum(length * attention_flops_per_token(args, length) for length in lengths)
    work["attention"] = attention * costs.attention_passes
    work["forward"] += attention * costs.forward
    work["chunks"] = math.ceil(tokens / max(setup.loss_chunk_tokens, 1))
    return work


def optimizer_bytes(setup: Setup) -> float:
    """What AdamW reads and writes per step: each trained parameter, its gradient and states."""
    args = setup.args
    if setup.lora is not None:
        return lora_params(args, setup.lora) * 4 * 7.0  # fp32: p, g, m, v read; p, m, v written
    b = setup.param_bytes
    states = setup.trained.extra_bytes_per_param(b)
    shards = setup.data_parallel if setup.zero_stage >= 1 else 1
    return args.num_params() * (2 * (b + states) + 2 * b) / shards


def step_work(
    setup: Setup,
    micro_batches: list[list[int]],
    fp8: str | None = None,
    dora: bool = False,
    frozen_forward_share: float = 0.0,
    collectives: dict[str, float] | None = None,
    captured: bool = False,
    attention_kernel: str = "flash",
    fp8_kernel: str = "tuneforge rowwise",
) -> StepWork:
    """The step's work: its micro-batches' (each a list of document lengths) and the step's own."""
    costs = token_work(setup, fp8, dora, frozen_forward_share)
    parts = [micro_batch_work(setup, m, costs) for m in micro_batches]

    def total(key: str) -> float:
        return sum(part.get(key, 0.0) for part in parts)

    gemms = {kind: total(kind) for kind in ("bf16", "fp8", "experts", "adapters")}
    compute = sum(gemms.values()) + total("attention")
    return StepWork(
        gemm_flops={kind: value for kind, value in gemms.items() if value > 0},
        attention_flops=total("attention"),
        attention_kernel=attention_kernel,
        fp8_kernel=fp8_kernel,
        restored_blocks=total("restored"),
        memory_bytes=total("memory") + optimizer_bytes(setup),
        dequant_bytes=total("dequant"),
        host_bytes=(total("host"), total("host")),
        forward_share=total("forward") / compute if compute else 0.5,
        collective_bytes=dict(collectives or {}),
        blocks_launched=setup.args.num_layers * len(micro_batches),
        compiled=setup.compiled,
        loss_chunks=int(total("chunks")),
        captured=captured,
    )
