"""Cost formulas against what the module really does."""

from dataclasses import replace

import pytest
import torch

from tuneforge.models.args import GemmaArgs, ModelArgs, MoEArgs
from tuneforge.models.cost import (
    LoraShape,
    activation_bytes_per_token,
    lora_params,
    training_flops_per_token,
)
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora

DENSE = ModelArgs(vocab_size=10, dim=256, num_layers=1, num_heads=8, num_kv_heads=2, ffn_dim=704)
SHAPES = {
    "dense": DENSE,
    "qk_norm": replace(DENSE, head_dim=64, qk_norm=True),
    # expert width chosen so that no expert tensor is as wide as the model (2 x 96 != 256)
    "moe": replace(DENSE, moe=MoEArgs(8, 2, 96), qk_norm=True, family="qwen3_moe"),
    "gemma": replace(
        DENSE, head_dim=64, qk_norm=True, gemma=GemmaArgs(64, ("full_attention",)),
        family="gemma3_text",
    ),
}  # fmt: skip


def saved_bytes_per_token(
    args: ModelArgs,
    dtype: torch.dtype,
    tokens: int = 256,
    lora: dict | None = None,
    compile_budget: float | None = None,
) -> float:
    """Bytes autograd saves for backward per token in one block's forward (parameters and
    rotary excluded; the slope between `tokens` and twice as many, so that per-step tensors
    such as the adapters' cast weights do not count); with `lora`, adapters on a frozen base;
    with `compile_budget`, the block compiled as the trainer compiles it, with that budget."""
    from tuneforge.execution.block_wrappers import compiled
    from tuneforge.models.decoder import Decoder

    model = Decoder(replace(args, num_layers=1), "sdpa").to(dtype)
    if lora is not None:
        apply_lora(model, lora, None, torch.float32)  # fp32 adapters, as the trainer makes them
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    block = model.layers[0]
    if compile_budget is not None:
        torch._dynamo.reset()
        block.forward = compiled(block.forward, compile_budget)

    def saved_bytes(count: int) -> int:
        rope = (
            torch.ones(count, args.rotary_dim, dtype=dtype),
            torch.zeros(count, args.rotary_dim, dtype=dtype),
        )
        skip = excluded | {t.untyped_storage().data_ptr() for t in rope}
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in skip:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        x = torch.randn(count, args.dim, dtype=dtype, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            block(x, rope, PackedSequences.from_lengths([count]))
        return sum(saved.values())

    return (saved_bytes(2 * tokens) - saved_bytes(tokens)) / tokens


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_bytes_match_what_autograd_saves(name, dtype):
    args = SHAPES[name]
    predicted = activation_bytes_per_token(
        args, 0, "none", dtype_bytes=torch.finfo(dtype).bits // 8
    )
    assert predicted == pytest.approx(saved_bytes_per_token(args, dtype), rel=0.05)
    assert activation_bytes_per_token(args, 0, "full", 2) == args.dim * 2


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
BANKS = ["experts.gate_up_proj", "experts.down_proj"]
LORA_CASES = {
    "dense-all-linear": ("dense", list(LoraShape(16).targets)),
    "dense-attention": ("dense", ATTENTION),
    "dense-q-v-down": ("dense", ["q_proj", "v_proj", "down_proj"]),
    "qk_norm-all-linear": ("qk_norm", list(LoraShape(16).targets)),
    "gemma-all-linear": ("gemma", list(LoraShape(16).targets)),
    "moe-attention": ("moe", ATTENTION),
    "moe-attention-experts": ("moe", ATTENTION + BANKS),
    "moe-down-bank": ("moe", ["experts.down_proj"]),
}


@pytest.mark.parametrize("case", sorted(LORA_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frozen_base_activation_bytes_match_what_autograd_saves(case, dtype):
    """A frozen base keeps less (no linear inputs, no normalised copies), the fp32 adapters
    keep their own inputs (copies of a bf16 model's, shared in an fp32 one)."""
    shape, targets = LORA_CASES[case]
    args = SHAPES[shape]
    banks = tuple(t.split(".")[-1] for t in targets if t.startswith("experts."))
    lora = LoraShape(16, tuple(t for t in targets if t not in BANKS), banks)
    predicted = activation_bytes_per_token(args, 0, "none", torch.finfo(dtype).bits // 8, lora)
    measured = saved_bytes_per_token(args, dtype, lora={"target_modules": targets, "rank": 16})
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dora_activation_bytes_match_what_autograd_saves(dtype):
    """DoRA keeps, per adapted linear, x·Wᵀ and the low-rank update for its magnitude's
    gradient, on top of LoRA's."""
    args = SHAPES["dense"]
    targets = ["q_proj", "v_proj", "down_proj"]
    lora = LoraShape(16, tuple(targets), dora=True)
    predicted = activation_bytes_per_token(args, 0, "none", torch.finfo(dtype).bits // 8, lora)
    settings = {"target_modules": targets, "rank": 16, "use_dora": True}
    assert predicted == pytest.approx(saved_bytes_per_token(args, dtype, lora=settings), rel=0.05)


COMPILED_CASES = {
    "dense-all-linear": ("dense", list(LoraShape(16).targets)),
    "qk_norm-full": ("qk_norm", None),
    "dense-attention": ("dense", ATTENTION),
    "moe-attention": ("moe", ATTENTION),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(COMPILED_CASES))
def test_compiled_block_activation_bytes_match_what_it_saves(case):
    """A bf16 block compiled as the trainer compiles it: the formula against the tensors its
    compiled graph saves; with a memory budget of 0.8, within 5% of what the graph keeps (the
    budget's curve was read off GPU runs of another shape)."""
    from tuneforge.models.cost import compiled_activation_bytes_per_token

    shape, targets = COMPILED_CASES[case]
    args = SHAPES[shape]
    lora_shape = lora = None
    if targets is not None:
        lora_shape, lora = LoraShape(16, tuple(targets)), {"target_modules": targets, "rank": 16}
    predicted = compiled_activation_bytes_per_token(args, 0, 2, lora_shape)
    measured = saved_bytes_per_token(args, torch.bfloat16, lora=lora, compile_budget=1.0)
    assert predicted == pytest.approx(measured, rel=0.02)
    eager = activation_bytes_per_token(args, 0, "none", 2, lora_shape)
    assert measured < 0.95 * eager
    if case == "dense-all-linear":
        estimate = compiled_activation_bytes_per_token(args, 0, 2, lora_shape, memory_budget=0.8)
        within = saved_bytes_per_token(args, torch.bfloat16, lora=lora, compile_budget=0.8)
        assert estimate == pytest.approx(within, rel=0.05)


def test_lora_parameter_count_matches_the_module():
    from tuneforge.models.decoder import Decoder

    args = ModelArgs(vocab_size=50, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=96)
    model = Decoder(args)
    lora = {"target_modules": ["q_proj", "v_proj", "down_proj"], "rank": 8, "alpha": 16}
    report = apply_lora(model, lora)
    assert (
        lora_params(args, LoraShape(8, ("q_proj", "v_proj", "down_proj")))
        == report.trainable_params
    )


def test_training_flops_follow_the_6n_rule_and_lora_saves_a_third():
    args = ModelArgs(
        vocab_size=32000, dim=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_dim=14336
    )
    full = training_flops_per_token(args, doc_len=1)
    matmul_params = args.num_params() - args.vocab_size * args.dim
    assert full == pytest.approx(6 * matmul_params, rel=1e-3)  # attention negligible at length 1
    lora = training_flops_per_token(args, doc_len=1, lora=LoraShape(16))
    assert lora == pytest.approx(4 * matmul_params, rel=0.01)
    # causal attention over 4096-token documents: 6 * layers * heads * head_dim * (L + 1)
    long = training_flops_per_token(args, doc_len=4096)
    assert long - full == pytest.approx(6 * 32 * 32 * 128 * 4096, rel=1e-3)


@pytest.mark.parametrize(
    "lora",
    [
        {"target_modules": ["all-linear"], "rank": 8},
        {"target_modules": ["all-linear"], "rank": 8, "rank_pattern": {"o_proj": 4}},
        {
            "target_modules": ["q_proj", "v_proj", "experts.down_proj"],
            "rank": 8,
            "rank_pattern": {r"re:model\.layers\.1\.self_attn\.q_proj": 32, "experts.down_proj": 2},
        },
    ],
)
def test_the_planners_lora_shape_counts_what_apply_lora_builds(lora):
    """One selection for both: ranks by `rank_pattern`, expert banks, defaults."""
    from tuneforge.config.sections.lora import LoraSection
    from tuneforge.models.args import MoEArgs
    from tuneforge.models.decoder import Decoder
    from tuneforge.peft.selection import lora_shape

    moe = MoEArgs(num_experts=4, top_k=2, expert_ffn_dim=24)
    args = ModelArgs(
        vocab_size=50,
        dim=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        ffn_dim=96,
        moe=moe,
        family="qwen3_moe",
        qk_norm=True,
    )
    section = LoraSection.model_validate(lora)
    shape = lora_shape(section, args)
    report = apply_lora(Decoder(args), section)
    assert lora_params(args, shape) == report.trainable_params  # nothing else trains


@pytest.mark.parametrize(("length", "window"), [(1, 4), (7, 4), (19, 8), (64, 64), (100, 1)])
def test_keys_seen_count_the_attention_mask(length, window):
    from tuneforge.models.attention import visible
    from tuneforge.models.cost import attention_flops_per_token, keys_seen

    mask = visible(length, window, torch.device("cpu"))
    assert keys_seen(length, window) == pytest.approx(mask.sum().item() / length)
    windowed = replace(DENSE, num_layers=2, sliding_window=window, family="mistral")
    per_key = 4 * DENSE.num_heads * DENSE.head_dim
    assert attention_flops_per_token(windowed, length) == pytest.approx(
        2 * per_key * mask.sum().item() / length
    )


@pytest.mark.parametrize("q_rank", [None, 24])
def test_latent_attention_and_shared_experts_are_counted(q_rank):
    """DeepSeek-V2's shape: parameters, the adapters `all-linear` and the banks put on it."""
    from tuneforge.config.sections.lora import LoraSection
    from tuneforge.models.args import LatentAttentionArgs
    from tuneforge.models.decoder import Decoder
    from tuneforge.peft.selection import lora_shape

    moe = MoEArgs(8, 2, 24, mlp_only_layers=(0,), shared_experts=2, routed_scaling=1.5)
    args = ModelArgs(
        vocab_size=50, dim=64, num_layers=2, num_heads=4, num_kv_heads=4, ffn_dim=96, moe=moe,
        latent_attention=LatentAttentionArgs(32, 16, 8, 12, q_rank), family="deepseek_v2",
    )  # fmt: skip
    model = Decoder(args)
    assert args.num_params() == sum(p.numel() for p in model.parameters())
    section = LoraSection(target_modules=["all-linear", "experts.down_proj"], rank=4)
    report = apply_lora(model, section)
    assert lora_params(args, lora_shape(section, args)) == report.trainable_params


def test_parameter_counts_read_in_the_unit_that_fits():
    from tuneforge.models.cost import parameter_count

    assert parameter_count(1_648_320) == "1.65 M"  # the demo's, once "0.00 B"
    assert parameter_count(8_030_261_248) == "8.03 B"
