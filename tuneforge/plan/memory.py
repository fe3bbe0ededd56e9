"""Per-GPU memory of a training setup, itemised.

Static tensors: weights, gradients and optimizer states, sharded as the data-parallel stage
says (0: DDP or one GPU; 1: optimizer states sharded; 2: gradients too; 3: weights too — FSDP2
with `reshard_after_forward=False` peaks like 2, with True like 3). `pure` precision is what
tuneforge's trainer does (gradients and AdamW states in the weights' dtype); `fp32-master` is the
bf16 mixed precision of DeepSpeed and others (fp32 master weights, m and v). LoRA adapters are
fp32 with their own gradients and optimizer; the frozen base has neither.

Activations come from the model's per-layer cost formulas (by checkpointing mode) for one
micro-batch, plus eager attention's score matrices, the chunked loss and the hidden states the
loss reads. `other` is the runtime: context, collective buffers and allocator rounding.
"""

from dataclasses import dataclass

from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import LoraShape, lora_params
from tuneforge.train.block_wrappers import checkpointed_blocks

GIB = 2**30
LOSS_CHUNK = 1024
CONTEXT_GIB = {"cuda": 0.6, "rocm": 1.0}
COLLECTIVE_BUFFERS_GIB = 0.5
ALLOCATOR_ROUNDING = 0.05
"""Share of dynamic memory lost to block rounding in the caching allocator."""


@dataclass(frozen=True)
class Setup:
    args: ModelArgs
    param_bytes: int
    """2 for bf16/fp16 weights, 4 for fp32."""
    tokens_per_micro_batch: int
    lora: LoraShape | None = None
    checkpointing: str = "none"
    checkpoint_every: int = 2
    attention: str = "flash"
    """`flash` (sdpa/varlen: no score matrix) or `eager`."""
    mean_doc_len: float = 1024.0
    """Mean document length: eager attention keeps one score matrix per document."""
    data_parallel: int = 1
    zero_stage: int = 0
    precision: str = "pure"
    platform: str = "cuda"
    expert_adapters: tuple[str, ...] = ()
    """Expert-bank projections with LoRA: `gate_up_proj`, `down_proj`."""
    shared_expert_adapters: bool = False


@dataclass(frozen=True)
class Memory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float

    @property
    def static(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.static + self.activations + self.other

    def gib(self) -> dict[str, float]:
        values = {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "other": self.other,
            "static": self.static,
            "total": self.total,
        }
        return {key: value / GIB for key, value in values.items()}


def _block_params(args: ModelArgs, layer: int) -> int:
    return args.attention_params() + args.mlp_params(layer, False) + 2 * args.dim


def static_bytes(setup: Setup) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU."""
    args, n, stage, b = setup.args, setup.data_parallel, setup.zero_stage, setup.param_bytes
    total = args.num_params()
    shard = n if n > 1 else 1
    if setup.lora is not None:
        adapters = lora_params(args, setup.lora) + expert_adapter_params(setup)
        base = total * b
        weights = (base / shard if stage >= 3 else base) + adapters * 4
        gradients = adapters * 4 / (shard if stage >= 2 else 1)
        optimizer = adapters * 8 / (shard if stage >= 1 else 1)
    else:
        master = 12 if setup.precision == "fp32-master" else 2 * b  # (master +) m + v
        weights = total * b / (shard if stage >= 3 else 1)
        gradients = total * b / (shard if stage >= 2 else 1)
        optimizer = total * master / (shard if stage >= 1 else 1)
    if stage >= 3 and n > 1:
        # the gathered working set: this block and the prefetched next, and the root (embedding
        # and output layer), which stays gathered through its forward, i.e. the whole step
        largest = max(_block_params(args, layer) for layer in range(args.num_layers))
        root = args.vocab_size * args.dim * (1 if args.tie_embeddings else 2)
        weights += (2 * largest + root * (n - 1) / n) * b
        if setup.lora is None:  # one block's unsharded gradients before reduce-scatter
            gradients += largest * b
    return weights, gradients, optimizer


def _expert_projection_shapes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    moe = args.moe
    assert moe is not None
    return {
        "gate_up_proj": (args.dim, 2 * moe.expert_ffn_dim),
        "down_proj": (moe.expert_ffn_dim, args.dim),
    }


def expert_adapter_params(setup: Setup) -> int:
    args, lora = setup.args, setup.lora
    if lora is None or args.moe is None or not setup.expert_adapters:
        return 0
    copies = 1 if setup.shared_expert_adapters else args.moe.num_experts
    shapes = _expert_projection_shapes(args)
    per_layer = sum(
        copies * lora.rank * (fan_in + fan_out)
        for name, (fan_in, fan_out) in shapes.items()
        if name in setup.expert_adapters
    )
    return per_layer * sum(args.is_sparse_layer(layer) for layer in range(args.num_layers))


def activation_bytes(setup: Setup) -> float:
    """What one micro-batch keeps for backward, at its peak."""
    args, tokens, b = setup.args, setup.tokens_per_micro_batch, setup.param_bytes
    checkpointed = set(
        checkpointed_blocks(args.num_layers, setup.checkpointing, setup.checkpoint_every)
    )
    kept = 0.0
    recompute = 0.0
    for layer in range(args.num_layers):
        full = args.activation_bytes_per_token(layer, "none", b)
        if setup.attention == "eager":  # scores and softmax per head, over each document
            full += args.num_heads * setup.mean_doc_len * (b + 4)
        if layer in checkpointed:
            kept += args.activation_bytes_per_token(layer, "full", b)
            recompute = max(recompute, full)  # one block is rebuilt at a time in backward
        else:
            kept += full
    per_token = kept + recompute + lora_activation_bytes_per_token(setup, checkpointed)
    # the hidden states the loss reads, and one chunk of fp32 logits (recomputed in backward)
    loss = tokens * args.dim * (b + 4) + min(tokens, LOSS_CHUNK) * args.vocab_size * 4
    return per_token * tokens + loss


def lora_activation_bytes_per_token(setup: Setup, checkpointed: set[int]) -> float:
    """fp32 adapters keep, per adapted linear and token, the fp32 copy of its input (A's
    gradient) and A's output (B's gradient); a checkpointed block keeps them only while it is
    rebuilt."""
    if setup.lora is None:
        return 0.0
    from tuneforge.models.cost import linear_shapes

    args, rank = setup.args, setup.lora.rank
    per_layer = []
    for layer in range(args.num_layers):
        size = sum(
            4 * (fan_in + rank)
            for name, (fan_in, _) in linear_shapes(args, layer).items()
            if name in setup.lora.targets
        )
        if args.moe is not None and args.is_sparse_layer(layer):  # per routed copy of a token
            size += args.moe.top_k * sum(
                4 * (fan_in + rank)
                for name, (fan_in, _) in _expert_projection_shapes(args).items()
                if name in setup.expert_adapters
            )
        per_layer.append(size)
    kept = sum(size for layer, size in enumerate(per_layer) if layer not in checkpointed)
    rebuilt = max((per_layer[layer] for layer in checkpointed), default=0)
    return kept + rebuilt


def other_bytes(setup: Setup, dynamic: float) -> float:
    context = CONTEXT_GIB.get(setup.platform, 0.6) * GIB
    collective = COLLECTIVE_BUFFERS_GIB * GIB if setup.data_parallel > 1 else 0.0
    return context + collective + ALLOCATOR_ROUNDING * dynamic


def predict_memory(setup: Setup) -> Memory:
    weights, gradients, optimizer = static_bytes(setup)
    activations = activation_bytes(setup)
    other = other_bytes(setup, activations + gradients)
    return Memory(weights, gradients, optimizer, activations, other)
