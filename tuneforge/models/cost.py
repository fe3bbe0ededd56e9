"""Cost formulas of a shape: FLOPs per trained token and activation bytes kept for backward.

They are estimates made from the shape alone (no module is built), for the planner and the
MFU metric; `ModelArgs` exposes them as methods.
"""

import itertools
from dataclasses import dataclass

from tuneforge.models.args import ModelArgs

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LATENT_NAMES = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
"""Latent attention's projections (DeepSeek-V2), beside q_proj and o_proj."""
PROJECTION_NAMES = LINEAR_NAMES + LATENT_NAMES


@dataclass(frozen=True)
class LoraShape:
    rank: int
    targets: tuple[str, ...] = LINEAR_NAMES
    experts: tuple[str, ...] = ()
    """Expert-bank projections with adapters: `gate_up_proj`, `down_proj`."""
    shared_experts: bool = False
    """One adapter per bank shared by all experts, instead of one per expert."""
    fp32_compute: bool = False
    """Adapter matmuls in fp32 (activations cast up) instead of the model's dtype."""
    ranks: tuple[tuple[int, str, int], ...] = ()
    """(layer, projection, rank) where a module has another rank than `rank` (`rank_pattern`)."""
    dora: bool = False
    """DoRA (`lora.use_dora`): each adapted linear also keeps x·Wᵀ and the low-rank update."""

    def rank_of(self, layer: int, name: str) -> int:
        for at, projection, rank in self.ranks:
            if at == layer and projection == name:
                return rank
        return self.rank


def linear_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, int]]:
    """(in, out) of every dense linear of one layer (routed experts excluded; a MoE layer's
    shared experts are one MLP)."""
    shapes = _attention_shapes(args)
    ffn = args.ffn_dim
    if args.is_sparse_layer(layer):
        assert args.moe is not None
        ffn = args.moe.expert_ffn_dim * args.moe.shared_experts
    if ffn:
        shapes |= {
            "gate_proj": (args.dim, ffn),
            "up_proj": (args.dim, ffn),
            "down_proj": (ffn, args.dim),
        }
    return shapes


def _attention_shapes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    heads, mla = args.num_heads, args.latent_attention
    if mla is None:
        return {
            "q_proj": (args.dim, heads * args.head_dim),
            "k_proj": (args.dim, args.num_kv_heads * args.head_dim),
            "v_proj": (args.dim, args.num_kv_heads * args.head_dim),
            "o_proj": (heads * args.head_dim, args.dim),
        }
    if mla.q_rank is None:
        queries = {"q_proj": (args.dim, heads * args.head_dim)}
    else:
        queries = {
            "q_a_proj": (args.dim, mla.q_rank),
            "q_b_proj": (mla.q_rank, heads * args.head_dim),
        }
    return queries | {
        "kv_a_proj_with_mqa": (args.dim, mla.kv_rank + mla.rope_dim),
        "kv_b_proj": (mla.kv_rank, heads * (mla.nope_dim + mla.v_dim)),
        "o_proj": (heads * mla.v_dim, args.dim),
    }


def expert_projection_shapes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    """(in, out) of one expert's projections, gate and up stacked as PEFT holds them."""
    moe = args.moe
    assert moe is not None
    return {
        "gate_up_proj": (args.dim, 2 * moe.expert_ffn_dim),
        "down_proj": (moe.expert_ffn_dim, args.dim),
    }


def lora_params(args: ModelArgs, lora: LoraShape, active: bool = False) -> int:
    """Adapter parameters: dense linears, and expert banks (one adapter per expert unless
    shared). `active`: those one token multiplies (top-k experts' adapters)."""
    return sum(layer_lora_params(args, lora, layer, active) for layer in range(args.num_layers))


def layer_lora_params(args: ModelArgs, lora: LoraShape, layer: int, active: bool = False) -> int:
    """`lora_params` of one layer."""
    shapes = linear_shapes(args, layer)
    total = sum(
        lora.rank_of(layer, name) * (fan_in + fan_out)
        for name, (fan_in, fan_out) in shapes.items()
        if name in lora.targets
    )
    if args.moe is not None and args.is_sparse_layer(layer) and lora.experts:
        copies = args.moe.top_k if active else 1 if lora.shared_experts else args.moe.num_experts
        total += sum(
            copies * lora.rank_of(layer, name) * (fan_in + fan_out)
            for name, (fan_in, fan_out) in expert_projection_shapes(args).items()
            if name in lora.experts
        )
    return total


def attention_flops_per_token(args: ModelArgs, doc_len: int) -> float:
    """Forward FLOPs of q·kᵀ and p·v per token: causal, so a token sees (L + 1) / 2 keys on
    average, or at most W of them in a layer with a sliding window of W."""
    per_key = 2 * args.num_heads * (args.head_dim + args.value_dim)  # q·kᵀ, then p·v
    return sum(per_key * keys_seen(doc_len, args.window(layer)) for layer in range(args.num_layers))


def keys_seen(doc_len: int, window: int | None) -> float:
    """The keys a token of a `doc_len`-token document attends to, on average."""
    if window is None or window >= doc_len:
        return (doc_len + 1) / 2
    return (window * (window + 1) / 2 + (doc_len - window) * window) / doc_len


def forward_matmul_flops_per_token(args: ModelArgs) -> float:
    """2 FLOPs per weight a token multiplies: active experts only, the embedding lookup excluded."""
    embedding = args.vocab_size * args.dim if not args.tie_embeddings else 0
    return 2 * (args.num_params(active=True) - embedding)


def forward_flops_per_token(args: ModelArgs, doc_len: int) -> float:
    """A forward pass without gradients (a preference reference's): matmuls and attention."""
    return forward_matmul_flops_per_token(args) + attention_flops_per_token(args, doc_len)


def training_flops_per_token(args: ModelArgs, doc_len: int, lora: LoraShape | None = None) -> float:
    """Forward + backward FLOPs per token. Full fine-tuning: backward = 2x forward (gradients of
    activations and of weights). LoRA: frozen weights need no weight gradient, so their backward
    is 1x forward; the adapters cost 3x their own forward."""
    matmuls = forward_matmul_flops_per_token(args)
    attention = attention_flops_per_token(args, doc_len)
    if lora is None:
        return 3 * matmuls + 3 * attention
    adapters = 2 * lora_params(args, lora, active=True)
    return 2 * matmuls + 3 * adapters + 3 * attention


def _norm_bytes(width: int, dtype_bytes: int, trainable: bool) -> int:
    # the input in its own dtype and one fp32 reciprocal RMS (`models.norm`); a trainable next
    # matmul also keeps the output, its input
    return dtype_bytes * width + 4 + (dtype_bytes * width if trainable else 0)


def attention_activation_bytes_per_token(
    args: ModelArgs, dtype_bytes: int = 2, trainable: bool = True
) -> float:
    """What one layer's attention keeps per token with flash-style kernels: q, k, v after rotary,
    the attention output, a log-sum-exp per head (and the q/k norms' inputs); o_proj's input
    (a contiguous copy of the output) only when o_proj's weight trains."""
    if args.latent_attention is not None:
        return _latent_attention_bytes(args, dtype_bytes, trainable)
    q_width, kv_width = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    outputs = 3 if trainable else 2
    attention = (outputs * q_width + 2 * kv_width) * dtype_bytes + args.num_heads * 4
    if args.qk_norm:
        # per-head norms: the input and one fp32 rstd per head (their output feeds rotary,
        # which keeps nothing of it)
        attention += dtype_bytes * (q_width + kv_width) + 4 * (args.num_heads + args.num_kv_heads)
    return attention


def _latent_attention_bytes(args: ModelArgs, dtype_bytes: int, trainable: bool) -> float:
    """Latent attention through the flash kernels, values padded to the keys' width: q, k, the
    padded v and output, a log-sum-exp per head, o_proj's input (when it trains); the latents'
    norms keep their inputs (the projections' whole outputs, of which they are views) and, for
    a next projection that trains, their outputs. Not yet checked against a GPU run."""
    mla = args.latent_attention
    assert mla is not None
    heads = args.num_heads
    kept = 4 * heads * args.head_dim * dtype_bytes + heads * 4
    kept += (mla.kv_rank + mla.rope_dim) * dtype_bytes + 4
    if mla.q_rank is not None:
        kept += mla.q_rank * dtype_bytes + 4
    if trainable:
        kept += heads * mla.v_dim * dtype_bytes + mla.kv_rank * dtype_bytes
        kept += mla.q_rank * dtype_bytes if mla.q_rank is not None else 0
    return kept


def _mlp_bytes(args: ModelArgs, layer: int, dtype_bytes: int, trainable: bool) -> float:
    inputs = 1 if trainable else 0  # a linear keeps its input only for its weight's gradient
    if not args.is_sparse_layer(layer):
        # gate, up, silu(gate), and silu(gate) * up (down_proj's input)
        return (3 + inputs) * args.ffn_dim * dtype_bytes
    moe = args.moe
    assert moe is not None
    # per routed copy: its input (when the banks train), gate, up, silu(gate), the product
    # (when down_proj trains), the output before weighting; sort order and routing weight; per
    # token: routing indexes and weights, router probabilities in fp32
    per_copy = ((1 + inputs) * args.dim + (3 + inputs) * moe.expert_ffn_dim) * dtype_bytes + 24
    return moe.top_k * per_copy + 2 * moe.num_experts * 4


SHARED_INPUTS = (
    ("q_proj", "k_proj", "v_proj", "q_a_proj", "kv_a_proj_with_mqa"),
    ("q_b_proj",),
    ("kv_b_proj",),
    ("o_proj",),
    ("gate_proj", "up_proj"),
    ("down_proj",),
)
"""Linears that read the same input."""


def adapter_bytes_per_token(
    args: ModelArgs, layer: int, lora: LoraShape, dtype_bytes: int = 2
) -> float:
    """What adapters keep per token (per routed copy for expert banks): A's output (B's
    gradient) and the input A reads (A's gradient) — the model's own activation, one per group
    of linears reading it, or with fp32 compute in a bf16 model an fp32 copy per adapter."""
    compute = 4 if lora.fp32_compute else dtype_bytes
    copies = compute != dtype_bytes
    shapes = linear_shapes(args, layer)
    adapted = [name for name in shapes if name in lora.targets]
    size = compute * sum(lora.rank_of(layer, name) for name in adapted)
    if lora.dora:  # the magnitude's gradient reads x·Wᵀ and the update, [out] each
        size += 2 * compute * sum(shapes[name][1] for name in adapted)
    for group in SHARED_INPUTS:
        readers = [name for name in group if name in adapted]
        if readers:
            size += compute * shapes[readers[0]][0] * (len(readers) if copies else 1)
    if args.moe is not None and args.is_sparse_layer(layer):
        banks = expert_projection_shapes(args)
        per_copy = sum(
            compute * lora.rank_of(layer, name) for name in banks if name in lora.experts
        )
        if "gate_up_proj" in lora.experts:
            per_copy += compute * args.dim
        if "down_proj" in lora.experts:
            per_copy += compute * args.moe.expert_ffn_dim
        size += args.moe.top_k * per_copy
    return size


def activation_bytes_per_token(
    args: ModelArgs,
    layer: int,
    checkpointing: str,
    dtype_bytes: int = 2,
    lora: LoraShape | None = None,
) -> float:
    """Bytes one layer keeps for backward per token, with flash-style attention (no score matrix).

    `none`: every tensor autograd saves (checked against saved-tensor hooks in the tests) — all
    weights training, or with `lora` a frozen base (which keeps less: no linear input, no
    normalised copy) plus the adapters' own; `full`: only the block input, the rest is
    recomputed during backward.
    """
    if checkpointing == "full":
        return args.dim * dtype_bytes
    trainable = lora is None
    norms = 2 * _norm_bytes(args.dim, dtype_bytes, trainable)
    if args.gemma is not None:  # the norms of the attention's and MLP's outputs: no matmul next
        norms += 2 * _norm_bytes(args.dim, dtype_bytes, False)
    attention = attention_activation_bytes_per_token(args, dtype_bytes, trainable)
    mlp = _mlp_bytes(args, layer, dtype_bytes, trainable)
    adapters = adapter_bytes_per_token(args, layer, lora, dtype_bytes) if lora is not None else 0.0
    return norms + attention + mlp + adapters


def compiled_activation_bytes_per_token(
    args: ModelArgs,
    layer: int,
    dtype_bytes: int = 2,
    lora: LoraShape | None = None,
    memory_budget: float = 1.0,
) -> float:
    """What one block compiled with torch.compile keeps per token (no checkpointing). Its
    partition keeps what eager autograd keeps but two tensors: silu(gate), made again from gate in
    backward, and o_proj's input, which is the attention output itself rather than a copy
    (checked against saved-tensor hooks on compiled blocks in the tests). Below `memory_budget`
    1, torch's `activation_memory_budget` keeps the block input plus the measured share of the
    rest (`budget_share`). Adapters computing in fp32 are not modelled: the eager bytes."""
    eager = activation_bytes_per_token(args, layer, "none", dtype_bytes, lora)
    if lora is not None and lora.fp32_compute:
        return eager
    o_proj_copy = lora is None or "o_proj" in lora.targets
    if args.is_sparse_layer(layer):
        assert args.moe is not None
        silu = args.moe.top_k * args.moe.expert_ffn_dim
    else:
        silu = args.ffn_dim
    q_width = args.num_heads * args.head_dim
    kept = eager - dtype_bytes * (silu + (q_width if o_proj_copy else 0))
    if memory_budget < 1.0:
        block_input = args.dim * dtype_bytes
        kept = block_input + budget_share(memory_budget) * (kept - block_input)
    return kept


BUDGET_SHARES = ((0.3, 0.05), (0.5, 0.53), (0.8, 0.68), (0.9, 0.68), (0.95, 0.88), (1.0, 1.0))
"""(budget, share kept of what the block could keep beside its input), measured on Llama-3-8B
LoRA blocks compiled on an H200 (bench/measured_steps.json: 33.7, 31.7, 28.2, 28.2 and 25.6 GiB
at budgets 1, 0.95, 0.9, 0.8 and 0.5; at 0.3 with an FP8 base, 10.1 GiB): the partitioner first drops what is cheap to make
again, a step between 0.95 and 0.9, then recomputes products."""


def budget_share(budget: float) -> float:
    """What a compiled block keeps at `activation_memory_budget` `budget`: a piecewise-linear
    reading of `BUDGET_SHARES`."""
    points = sorted(BUDGET_SHARES)
    if budget <= points[0][0]:
        return points[0][1] * budget / points[0][0]
    for (low, low_share), (high, high_share) in itertools.pairwise(points):
        if budget <= high:
            return low_share + (high_share - low_share) * (budget - low) / (high - low)
    return 1.0


def working_bytes_per_token(
    args: ModelArgs, layer: int, dtype_bytes: int = 2, lora: LoraShape | None = None
) -> float:
    """Short-lived bytes per token while one block runs, on top of what it keeps. Dense MLP: its
    intermediate gradients (gate, up, activation), or with fp32 adapter matmuls on gate/up the
    fp32 update and its scaled copy beside the base output. MoE, per routed copy: the gradients
    of each copy's input and output, or with fp32 expert adapters the fp32 update of the output,
    its scaled copy and their casts. Measured on the modules under fake tensors with fp32
    adapter matmuls: 5.6 x ffn bytes (full), 7.5 x ffn (LoRA on all linears), 9.3 kB and 26 kB
    per routed copy (Qwen3-30B-A3B with LoRA on attention, and on attention and experts)."""
    fp32_adapters = lora is not None and lora.fp32_compute
    if args.moe is not None and args.is_sparse_layer(layer):
        moe = args.moe
        if lora is not None and fp32_adapters and lora.experts:
            return moe.top_k * (8 + 2 * dtype_bytes) * args.dim
        return moe.top_k * (2 * args.dim + moe.expert_ffn_dim) * dtype_bytes
    adapted = (
        lora is not None
        and fp32_adapters
        and any(name in lora.targets for name in ("gate_proj", "up_proj"))
    )
    return args.ffn_dim * ((2 * dtype_bytes + 4) if adapted else 3 * dtype_bytes)


def parameter_count(parameters: float) -> str:
    """1.65 M, 8.03 B: a small shape (the demo's) is not shown as 0.00 B."""
    if parameters >= 1e8:
        return f"{parameters / 1e9:.2f} B"
    return f"{parameters / 1e6:.2f} M"
