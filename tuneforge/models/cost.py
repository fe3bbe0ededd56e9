"""Cost formulas of a shape: FLOPs per trained token and activation bytes kept for backward.

They are estimates made from the shape alone (no module is built), for the planner and the
MFU metric; `ModelArgs` exposes them as methods.
"""

from dataclasses import dataclass

from tuneforge.models.args import ModelArgs

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraShape:
    rank: int
    targets: tuple[str, ...] = LINEAR_NAMES


def linear_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, int]]:
    """(in, out) of every dense linear of one layer (experts excluded)."""
    shapes = {
        "q_proj": (args.dim, args.num_heads * args.head_dim),
        "k_proj": (args.dim, args.num_kv_heads * args.head_dim),
        "v_proj": (args.dim, args.num_kv_heads * args.head_dim),
        "o_proj": (args.num_heads * args.head_dim, args.dim),
    }
    if not args.is_sparse_layer(layer):
        shapes |= {
            "gate_proj": (args.dim, args.ffn_dim),
            "up_proj": (args.dim, args.ffn_dim),
            "down_proj": (args.ffn_dim, args.dim),
        }
    return shapes


def lora_params(args: ModelArgs, lora: LoraShape) -> int:
    return sum(
        lora.rank * (fan_in + fan_out)
        for layer in range(args.num_layers)
        for name, (fan_in, fan_out) in linear_shapes(args, layer).items()
        if name in lora.targets
    )


def attention_flops_per_token(args: ModelArgs, doc_len: int) -> float:
    """Forward FLOPs of q·kᵀ and p·v per token: causal, so a token sees (L + 1) / 2 keys on average."""
    return args.num_layers * 4 * args.num_heads * args.head_dim * (doc_len + 1) / 2


def forward_matmul_flops_per_token(args: ModelArgs) -> float:
    """2 FLOPs per weight a token multiplies: active experts only, the embedding lookup excluded."""
    embedding = args.vocab_size * args.dim if not args.tie_embeddings else 0
    return 2 * (args.num_params(active=True) - embedding)


def training_flops_per_token(args: ModelArgs, doc_len: int, lora: LoraShape | None = None) -> float:
    """Forward + backward FLOPs per token. Full fine-tuning: backward = 2x forward (gradients of
    activations and of weights). LoRA: frozen weights need no weight gradient, so their backward
    is 1x forward; the adapters cost 3x their own forward."""
    matmuls = forward_matmul_flops_per_token(args)
    attention = attention_flops_per_token(args, doc_len)
    if lora is None:
        return 3 * matmuls + 3 * attention
    adapters = 2 * lora_params(args, lora)
    return 2 * matmuls + 3 * adapters + 3 * attention


def _norm_bytes(width: int, dtype_bytes: int) -> int:
    # fp32 copy of the input (rms_norm runs in fp32), the cast result (for the weight's gradient),
    # the output (the next matmul's input) and one fp32 rstd
    return 4 * width + 2 * width * dtype_bytes + 4


def attention_activation_bytes_per_token(args: ModelArgs, dtype_bytes: int = 2) -> float:
    """What one layer's attention keeps per token with flash-style kernels: q, k, v after rotary,
    the attention output and o_proj's input, a log-sum-exp per head (and the q/k norms' inputs)."""
    q_width, kv_width = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    attention = (3 * q_width + 2 * kv_width) * dtype_bytes + args.num_heads * 4
    if args.qk_norm:
        # per-head norms: fp32 input copy, cast result, one fp32 rstd per head (the output feeds
        # rotary, which keeps nothing of it)
        attention += (4 + dtype_bytes) * (q_width + kv_width) + 4 * (
            args.num_heads + args.num_kv_heads
        )
    return attention


def activation_bytes_per_token(
    args: ModelArgs, layer: int, checkpointing: str, dtype_bytes: int = 2
) -> float:
    """Bytes one layer keeps for backward per token, with flash-style attention (no score matrix).

    `none`: every tensor autograd saves (checked against saved-tensor hooks in the tests);
    `full`: only the block input; everything else is recomputed during backward.
    """
    if checkpointing == "full":
        return args.dim * dtype_bytes
    norms = 2 * _norm_bytes(args.dim, dtype_bytes)
    attention = attention_activation_bytes_per_token(args, dtype_bytes)
    if args.is_sparse_layer(layer):
        moe = args.moe
        assert moe is not None
        # per routed copy: its input, gate, up, silu(gate), their product, the output before and
        # after weighting; routing indexes and weights; router probabilities in fp32
        per_copy = (3 * args.dim + 4 * moe.expert_ffn_dim) * dtype_bytes + 24
        mlp = moe.top_k * per_copy + 2 * moe.num_experts * 4
    else:
        mlp = 4 * args.ffn_dim * dtype_bytes  # gate, up, silu(gate), silu(gate) * up
    return norms + attention + mlp
