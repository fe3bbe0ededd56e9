"""Per-GPU memory of a training setup, itemised, and its peak through one step.

Static tensors: weights, gradients and optimizer states, sharded as the data-parallel stage
says (0: DDP or one GPU; 1: optimizer states sharded; 2: gradients too; 3: weights too — FSDP2
with `reshard_after_forward=False` peaks like 2, with True like 3). What the optimizer keeps
beside trained 16-bit weights is `precision.master_weights`' (`TrainedWeights`): fp32 masters
and AdamW states, a remainder and fp32 states, or states in the weights' dtype. LoRA adapters
are fp32 with their own gradients and optimizer; the frozen base has neither.

Activations come from the model's per-layer cost formulas (by checkpointing mode, frozen or
training base, eager or compiled blocks) for one micro-batch, plus eager attention's score
matrices and the loss's buffers. Gradients and activations do not peak together: gradients are freed after each
optimizer step and written during backward while activations are released, so the peak is the
largest of three moments — the loss (all activations, the loss making its gradients, no
weight gradient yet unless accumulated), a block's backward, and the end of backward — on top
of weights and optimizer states. `other` is the runtime: context, collective buffers and allocator rounding.
"""

from dataclasses import dataclass, field, replace

from tuneforge.hardware.gpus import GIB
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import (
    LoraShape,
    activation_bytes_per_token,
    compiled_activation_bytes_per_token,
    layer_lora_params,
    lora_params,
    working_bytes_per_token,
)
from tuneforge.plan.base_weights import BaseWeights
from tuneforge.plan.policies import offloaded_blocks, recomputed_blocks
from tuneforge.plan.rank_shares import RankShares, rank_shares
from tuneforge.precision.trained_weights import TrainedWeights

CONTEXT_GIB = {"cuda": 0.6, "rocm": 1.0}
COLLECTIVE_BUFFERS_GIB = 0.5
ALLOCATOR_ROUNDING = 0.05
"""Share of dynamic memory lost to block rounding in the caching allocator."""
FOUR_BIT_COMPILED_WIDTHS = 2
"""A compiled block over a 4-bit base keeps two of the model's width per token, and the
attention's statistics, as its saved-tensor hooks see it (bench/saved_bytes_probe.py; the
figures in bench/RESULTS.md), a fraction of what it keeps over a bf16 base; the QLoRA runs'
measured peaks agree (docs/plan.md, Validation)."""
FP8_BASE_RESERVE_GIB = 1.0
"""Cached blocks an FP8 LoRA base's products hold besides (its quantised operands of many
sizes): Llama-3-8B's FP8-base steps hold 1.3-2.4 GiB over their allocated peak where its bf16
steps hold 0.4-0.8 (bench/measured_steps.json)."""
FOUR_BIT_BASE_RESERVE_GIB = 0.8
"""The same for a 4-bit base (each weight dequantised for its products), read off the QLoRA
steps in bench/measured_steps.json."""


@dataclass(frozen=True)
class Setup:
    args: ModelArgs
    param_bytes: int
    """2 for bf16/fp16 weights, 4 for fp32."""
    tokens_per_micro_batch: int
    lora: LoraShape | None = None
    checkpointing: str = "none"
    checkpoint_every: int = 2
    offload_checkpoints: bool = False
    """Checkpointed blocks keep their input in host memory: nothing on the GPU."""
    offload_activations: int = 0
    """Blocks whose saved activations wait in host memory: nothing on the GPU between their
    forward and backward (and each comes back once the block above has done its backward)."""
    keep_activations: int = 0
    """The last checkpointed blocks that keep their activations on the GPU instead."""
    offload_embedding: bool = False
    """The frozen, untied input embedding in host memory: its weights are not on the GPU."""
    attention: str = "flash"
    """`flash` (sdpa/varlen: no score matrix) or `eager`."""
    mean_doc_len: float = 1024.0
    """Mean document length: eager attention keeps one score matrix per document."""
    data_parallel: int = 1
    zero_stage: int = 0
    trained: TrainedWeights = field(default_factory=lambda: TrainedWeights("pure", "bfloat16"))
    """What the optimizer keeps beside the trained weights (full fine-tuning)."""
    platform: str = "cuda"
    grad_accum_steps: int = 1
    """Above 1, gradients stay allocated through the forward of the later micro-batches."""
    loss_chunk_tokens: int = 1024
    """Tokens per chunk of the loss: one chunk's logits exist at a time."""
    compiled: bool = False
    """Blocks (and the loss's softmax) compiled: they keep less than eager autograd."""
    compile_memory_budget: float = 1.0
    """Below 1, compiled blocks keep less of what they could (`models.cost.budget_share`)."""
    base_weights: BaseWeights = field(default_factory=BaseWeights)
    """How the frozen base linears are held (FP8, FP4 or the model's dtype)."""
    frozen_copy: bool = False
    """Preference training's reference held as a frozen copy of the model (its blocks sharded
    under FSDP2: `frozen_weight_bytes`)."""
    extra_weight_bytes: float = 0.0
    """Weights per GPU of another model held beside this one (a distillation teacher)."""
    fp8_inputs: bool = False
    """Trained linears in FP8 (a full fine-tune with `precision.fp8`): their inputs kept in FP8."""
    generation_cache_bytes: float = 0.0
    """The key/value cache of completions sampled before the step (GRPO): the step's other
    peak, freed before its forward."""
    tensor: int = 1
    """Tensor-parallel ranks: each holds and computes its share of every layer's heads and MLP."""
    expert: int = 1
    """Expert-parallel ranks (a share of `data_parallel`): each holds its share of the experts."""
    replicate: int = 1
    """HSDP's replica groups: FSDP2 shards over `data_parallel / replicate` ranks."""

    @property
    def on_mesh(self) -> bool:
        return self.tensor > 1 or self.expert > 1 or self.replicate > 1

    @property
    def rank_args(self) -> ModelArgs:
        """The shape one rank computes: its tensor-parallel share of the heads and the MLP."""
        if self.tensor == 1:
            return self.args
        t = self.tensor
        return replace(
            self.args,
            num_heads=self.args.num_heads // t,
            num_kv_heads=self.args.num_kv_heads // t,
            ffn_dim=self.args.ffn_dim // t,
        )

    def shares(self) -> RankShares:
        """The parameters a rank holds, and the ranks FSDP2 shards them over."""
        dense = self.data_parallel // self.replicate if sharded_by_fsdp(self) else 1
        routed = max(1, dense // self.expert)
        return rank_shares(self.args, self.tensor, self.expert, dense, routed)


@dataclass(frozen=True)
class Memory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    """What one micro-batch keeps for backward, with the loss's buffers, at their peak."""
    other: float
    allocated: float
    """The step's peak of allocated tensors: weights, optimizer states and the largest moment
    of gradients plus activations (not their sum: they peak at different times)."""
    context: float = 0.0
    """The CUDA or HIP context, part of `other` and outside the allocator's pool."""
    generation_cache: float = 0.0
    """The key/value cache of the completions an objective samples before the step (GRPO):
    the step's other peak, not held with the activations."""

    @property
    def static(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.allocated + self.other

    @property
    def reserved(self) -> float:
        """What the allocator's pool holds: the memory a run needs under a hold of its size
        (`torch.cuda.set_per_process_memory_fraction`, `bench --cap-gib`)."""
        return self.total - self.context

    def gib(self) -> dict[str, float]:
        values = {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            **({"generation_cache": self.generation_cache} if self.generation_cache else {}),
            "other": self.other,
            "static": self.static,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "total": self.total,
        }
        return {key: value / GIB for key, value in values.items()}


def _block_params(args: ModelArgs, layer: int) -> int:
    return args.attention_params() + args.mlp_params(layer, False) + 2 * args.dim


def _root_params(args: ModelArgs) -> int:
    """The embedding, the output layer (unless tied) and the final norm: FSDP2's root unit."""
    return args.vocab_size * args.dim * (1 if args.tie_embeddings else 2) + args.dim


def frozen_weight_bytes(args: ModelArgs, param_bytes: int, ranks: int) -> float:
    """A frozen model held beside the trained one, per GPU: its blocks sharded across `ranks`
    (FSDP2; 1 otherwise), its embedding, output layer and final norm whole on every rank."""
    root = _root_params(args)
    return ((args.num_params() - root) / ranks + root) * param_bytes


def sharded_by_fsdp(setup: Setup) -> bool:
    return setup.data_parallel > 1 and setup.zero_stage >= 2


def static_bytes(setup: Setup) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU."""
    args, n, stage, b = setup.args, setup.data_parallel, setup.zero_stage, setup.param_bytes
    if setup.on_mesh:
        return _mesh_static_bytes(setup)
    total = args.num_params()
    shard = n if n > 1 else 1
    if setup.lora is not None:
        adapters = lora_params(args, setup.lora)
        linears = setup.base_weights.swapped(args)[0] * b
        base = total * b - linears + sum(setup.base_weights.bytes(args, b))
        if setup.offload_embedding and not args.tie_embeddings:
            base -= args.vocab_size * args.dim * b
        kept_shards = base / shard
        weights = (kept_shards if stage >= 3 else base) + adapters * 4
        gradients = adapters * 4 / (shard if stage >= 2 else 1)
        optimizer = adapters * 8 / (shard if stage >= 1 else 1)
    else:
        master = setup.trained.extra_bytes_per_param(b)  # (master or remainder +) m + v
        # FSDP2's fp32 shards are the master the optimizer bytes count; their gradients are fp32
        fp32_shards = sharded_by_fsdp(setup) and setup.trained.fp32_shards(True)
        kept_shards = 0.0 if fp32_shards else total * b / shard
        weights = kept_shards if stage >= 3 else total * b
        gradients = total * (4 if fp32_shards else b) / (shard if stage >= 2 else 1)
        optimizer = total * master / (shard if stage >= 1 else 1)
    if stage == 2 and sharded_by_fsdp(setup):
        # ZeRO-2 keeps the gathered weights from forward to backward beside FSDP2's own shards
        weights += kept_shards
    if setup.frozen_copy:
        weights += frozen_weight_bytes(args, b, n if sharded_by_fsdp(setup) else 1)
    weights += setup.extra_weight_bytes
    if stage >= 3 and n > 1:
        # the gathered working set: this block and the prefetched next, and the root, which
        # stays gathered through its forward, i.e. the whole step
        largest = max(_block_params(args, layer) for layer in range(args.num_layers))
        weights += (2 * largest + _root_params(args) * (n - 1) / n) * b
    return weights, gradients, optimizer


def _mesh_static_bytes(setup: Setup) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per rank on a device mesh: each parameter group
    sharded over its own ranks (`Setup.shares`). LoRA adapters are counted whole on every
    rank (an upper bound: tensor and expert parallelism split them too)."""
    shares, stage, b = setup.shares(), setup.zero_stage, setup.param_bytes
    held = shares.sharded()
    if setup.lora is not None:
        adapters = lora_params(setup.args, setup.lora)
        base = held if stage >= 3 else shares.whole()
        return base * b + adapters * 4, adapters * 4, adapters * 8
    master = setup.trained.extra_bytes_per_param(b)
    weights = (held if stage >= 3 else shares.whole()) * b
    gradients = (held if stage >= 2 else shares.whole()) * b
    return weights, gradients, held * master


def kept_bytes_per_token(setup: Setup, layer: int, checkpointing: str) -> float:
    """What layer `layer` keeps per token in mode `checkpointing`."""
    args, b = setup.rank_args, setup.param_bytes
    if checkpointing == "full" and setup.offload_checkpoints:
        return 0.0
    if checkpointing == "none" and setup.compiled and setup.base_weights.format.startswith("bnb"):
        kept: float = FOUR_BIT_COMPILED_WIDTHS * args.dim * b + args.num_heads * 4.0
    elif checkpointing == "none" and setup.compiled:
        kept = compiled_activation_bytes_per_token(
            args, layer, b, setup.lora, setup.compile_memory_budget
        )
    else:
        kept = activation_bytes_per_token(args, layer, checkpointing, b, setup.lora)
    if checkpointing == "none" and setup.attention == "eager":
        kept += args.num_heads * setup.mean_doc_len * (b + 4)  # scores and softmax per head
    if checkpointing == "none" and setup.fp8_inputs:
        kept -= fp8_input_savings(args, layer, b)
    return kept


def fp8_input_savings(args: ModelArgs, layer: int, dtype_bytes: int) -> float:
    """Trained linears computing in FP8 keep their inputs for the weight gradient in FP8: a
    byte instead of `dtype_bytes` for the normed inputs of attention and the MLP, the attention
    output and the MLP's product (a MoE layer's experts stay in the model's dtype)."""
    widths = 2 * args.dim + args.num_heads * args.head_dim
    if not args.is_sparse_layer(layer):
        widths += args.ffn_dim
    return widths * (dtype_bytes - 1)


def _loss_bytes(setup: Setup) -> tuple[float, float, float]:
    """(kept through the step, transient while the loss runs, the output layer's gradient).
    Kept: the final norm's input and the hidden states' gradient, which the loss makes
    in its forward pass. Transient: one chunk of logits in fp32 (and their bf16 product and
    gradient in a bf16 model; compiled, the bf16 logits and gradient only). The output layer's
    gradient when it trains (unsharded under FSDP2 until the root unit reduces it at the end of
    backward)."""
    args, tokens, b = setup.args, setup.tokens_per_micro_batch, setup.param_bytes
    trainable = setup.lora is None
    norm = args.dim * b + 4
    kept = tokens * (norm + args.dim * b)
    head_gradient = args.vocab_size * args.dim * b if trainable else 0
    per_logit = 2 * b if setup.compiled else 4 + (b if b != 4 else 0)
    return kept, per_logit * min(tokens, setup.loss_chunk_tokens) * args.vocab_size, head_gradient


def _adapter_casts(setup: Setup) -> float:
    """Adapters computing in a bf16 model's dtype keep bf16 copies of their fp32 weights."""
    lora = setup.lora
    if lora is None or lora.fp32_compute or setup.param_bytes == 4:
        return 0.0
    return lora_params(setup.args, lora) * setup.param_bytes


def _reduce_bytes(setup: Setup, params: int) -> float:
    """FSDP2 reducing a unit's gradients: the unsharded gradients and their fp32 copy."""
    if not sharded_by_fsdp(setup) or setup.lora is not None:
        return 0.0
    return params * (setup.param_bytes + 4)


def context_bytes(setup: Setup) -> float:
    """The CUDA or HIP context: outside the allocator's pool."""
    return CONTEXT_GIB.get(setup.platform, 0.6) * GIB


def other_bytes(setup: Setup, dynamic: float) -> float:
    held = COLLECTIVE_BUFFERS_GIB * GIB if setup.data_parallel > 1 else 0.0
    if setup.lora is not None and setup.base_weights.format.startswith("fp8"):
        held += FP8_BASE_RESERVE_GIB * GIB
    if setup.base_weights.format.startswith("bnb"):
        held += FOUR_BIT_BASE_RESERVE_GIB * GIB
    return context_bytes(setup) + held + ALLOCATOR_ROUNDING * dynamic


def _layer_gradients(setup: Setup) -> list[float]:
    """Gradient bytes of each layer once its backward is done (sharded under FSDP2)."""
    args = setup.args
    shard = setup.data_parallel if setup.zero_stage >= 2 else 1
    if setup.lora is not None:  # fp32 adapters
        return [
            layer_lora_params(args, setup.lora, layer) * 4 / shard
            for layer in range(args.num_layers)
        ]
    return [
        _block_params(args, layer) * setup.param_bytes / shard for layer in range(args.num_layers)
    ]


def _step_moments(setup: Setup, gradients: float) -> tuple[float, list[float]]:
    """(activations, dynamic bytes at each moment of the step that can be its peak)."""
    args, tokens = setup.args, setup.tokens_per_micro_batch
    recomputed = recomputed_blocks(
        args.num_layers,
        setup.checkpointing,
        setup.checkpoint_every,
        setup.offload_activations,
        setup.keep_activations,
    )
    on_host = set(offloaded_blocks(args.num_layers, setup.offload_activations))
    kept = [
        0.0
        if layer in on_host
        else kept_bytes_per_token(setup, layer, "full" if layer in recomputed else "none") * tokens
        for layer in range(args.num_layers)
    ]
    coming_back = _coming_back(setup, on_host, recomputed)
    slots = _staging_slots(coming_back)
    loss_kept, loss_transient, head_gradient = _loss_bytes(setup)
    loss_kept += _adapter_casts(setup)
    activations = sum(kept) + loss_kept + loss_transient + head_gradient
    # Gradients are freed after each step; they stay through the forward only when the step
    # accumulates micro-batches or DDP holds them in its buckets.
    persistent = setup.grad_accum_steps > 1 or (setup.data_parallel > 1 and setup.zero_stage < 2)
    layer_gradients = _layer_gradients(setup)
    largest_block = max(_block_params(args, layer) for layer in range(args.num_layers))
    # the loss, while the first offloaded block to come back is fetched into its slot
    moments = [activations + (gradients if persistent else 0.0) + max(slots)]
    below, written = _adapter_casts(setup), sum(layer_gradients) + head_gradient
    for layer in range(args.num_layers):
        # this block's backward: the layers below keep theirs, this one is whole (rebuilt if
        # checkpointed), the layers above have written their gradients; the staging slots of
        # offloaded blocks stay through backward (this block's own part counted as its own)
        moments.append(
            below
            + kept_bytes_per_token(setup, layer, "none") * tokens
            + working_bytes_per_token(setup.rank_args, layer, setup.param_bytes, setup.lora)
            * tokens
            + (gradients if persistent else written)
            + _reduce_bytes(setup, largest_block)
            + sum(slots)
            - coming_back.get(layer, 0.0)
        )
        below += kept[layer]
        written -= layer_gradients[layer]
    # the end of backward: every gradient, a tied embedding's second gradient being added to
    # the first, and under FSDP2 the root unit's reduction
    tied = head_gradient if args.tie_embeddings else 0.0
    moments.append(gradients + tied + _reduce_bytes(setup, _root_params(args)))
    return activations, moments


def _coming_back(setup: Setup, on_host: set[int], recomputed: set[int]) -> dict[int, float]:
    """Bytes each offloaded block brings back from host memory in backward: its saved
    activations, or a checkpointed block's input."""
    args, tokens = setup.args, setup.tokens_per_micro_batch
    back = {}
    for layer in range(args.num_layers):
        if layer in on_host:
            back[layer] = kept_bytes_per_token(setup, layer, "none") * tokens
        elif layer in recomputed and setup.offload_checkpoints:
            back[layer] = args.dim * setup.param_bytes * tokens
    return back


def _staging_slots(coming_back: dict[int, float]) -> list[float]:
    """The two staging slots' sizes: backward brings the offloaded blocks back into them in
    turn (`parallel/staging_slots.py`), each slot as large as the largest block it takes."""
    slots = [0.0, 0.0]
    for turn, layer in enumerate(sorted(coming_back, reverse=True)):
        slots[turn % 2] = max(slots[turn % 2], coming_back[layer])
    return slots


def generation_cache_bytes(
    args: ModelArgs, sequences: float, tokens_each: float, param_bytes: int
) -> float:
    """Keys and values of every layer for `sequences` sequences of `tokens_each` tokens, as the
    generator's cache holds them (`Decoder.new_cache`, in the model's dtype)."""
    per_token = args.num_layers * args.num_kv_heads * (args.head_dim + args.value_dim) * param_bytes
    return sequences * tokens_each * per_token


def predict_memory(setup: Setup) -> Memory:
    weights, gradients, optimizer = static_bytes(setup)
    activations, moments = _step_moments(setup, gradients)
    dynamic = max(*moments, setup.generation_cache_bytes)
    allocated = weights + optimizer + dynamic
    return Memory(
        weights,
        gradients,
        optimizer,
        activations,
        other_bytes(setup, dynamic),
        allocated,
        context_bytes(setup),
        setup.generation_cache_bytes,
    )
