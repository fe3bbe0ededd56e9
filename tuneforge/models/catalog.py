"""Named shapes of real models (and the demo), buildable with random weights as proxies.

Shapes copy the published `config.json` of each model; `tuneforge models` lists them.
"""

from tuneforge.errors import TuneforgeError
from tuneforge.models.args import (
    GemmaArgs,
    LatentAttentionArgs,
    LinearScaling,
    ModelArgs,
    MoEArgs,
    RopeScaling,
    YarnScaling,
)

LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def llama2(dim: int, layers: int, heads: int, kv_heads: int, ffn: int) -> ModelArgs:
    return ModelArgs(
        vocab_size=32000, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, ffn_dim=ffn,
        norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, family="llama",
    )  # fmt: skip


def llama3(
    dim: int, layers: int, heads: int, ffn: int, rope: RopeScaling | None, tied: bool = False
) -> ModelArgs:
    return ModelArgs(
        vocab_size=128256, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=8, ffn_dim=ffn,
        head_dim=dim // heads, norm_eps=1e-5, rope_theta=500000.0, rope_scaling=rope, tie_embeddings=tied,
        max_position_embeddings=131072 if rope else 8192, family="llama",
    )  # fmt: skip


def qwen25(
    dim: int, layers: int, heads: int, kv_heads: int, ffn: int, tied: bool = False
) -> ModelArgs:
    return ModelArgs(
        vocab_size=152064 if not tied else 151936, dim=dim, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, ffn_dim=ffn, norm_eps=1e-6, rope_theta=1000000.0, tie_embeddings=tied,
        attention_bias=True, max_position_embeddings=32768, family="qwen2",
    )  # fmt: skip


def qwen3(dim: int, layers: int, heads: int, kv_heads: int, ffn: int, tied: bool) -> ModelArgs:
    return ModelArgs(
        vocab_size=151936, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, ffn_dim=ffn,
        head_dim=128, norm_eps=1e-6, rope_theta=1000000.0, tie_embeddings=tied, qk_norm=True,
        max_position_embeddings=40960, family="qwen3",
    )  # fmt: skip


def qwen3_moe(
    dim: int, layers: int, heads: int, kv_heads: int, ffn: int, expert_ffn: int
) -> ModelArgs:
    return ModelArgs(
        vocab_size=151936, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, ffn_dim=ffn,
        head_dim=128, norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_position_embeddings=40960,
        moe=MoEArgs(num_experts=128, top_k=8, expert_ffn_dim=expert_ffn, norm_topk_prob=True),
        family="qwen3_moe",
    )  # fmt: skip


def mistral(vocab: int, theta: float, window: int | None) -> ModelArgs:
    return ModelArgs(
        vocab_size=vocab, dim=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_dim=14336,
        head_dim=128, norm_eps=1e-5, rope_theta=theta, max_position_embeddings=32768,
        sliding_window=window, family="mistral",
    )  # fmt: skip


def mixtral(vocab: int, dim: int, layers: int, heads: int, ffn: int, context: int) -> ModelArgs:
    return ModelArgs(
        vocab_size=vocab, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=8, ffn_dim=ffn,
        head_dim=128, norm_eps=1e-5, rope_theta=1000000.0, max_position_embeddings=context,
        moe=MoEArgs(num_experts=8, top_k=2, expert_ffn_dim=ffn, norm_topk_prob=True,
                    router_aux_loss_coef=0.02),
        family="mixtral",
    )  # fmt: skip


DEEPSEEK_V2_LITE = ModelArgs(
    vocab_size=102400, dim=2048, num_layers=27, num_heads=16, num_kv_heads=16, ffn_dim=10944,
    norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=163840,
    rope_scaling=YarnScaling(factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0,
                             beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),
    latent_attention=LatentAttentionArgs(kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128),
    moe=MoEArgs(num_experts=64, top_k=6, expert_ffn_dim=1408, norm_topk_prob=False,
                mlp_only_layers=(0,), shared_experts=2),
    family="deepseek_v2",
)  # fmt: skip


def gemma3(
    vocab: int,
    dim: int,
    layers: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    head_dim: int,
    scalar: int,
    window: int,
    scaled: bool,
) -> ModelArgs:
    types = tuple(
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
    )
    return ModelArgs(
        vocab_size=vocab, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        ffn_dim=ffn, head_dim=head_dim, norm_eps=1e-6, rope_theta=1000000.0,
        rope_scaling=LinearScaling(8.0) if scaled else None, tie_embeddings=True, qk_norm=True,
        max_position_embeddings=131072 if scaled else 32768, sliding_window=window,
        gemma=GemmaArgs(query_pre_attn_scalar=scalar, layer_types=types), family="gemma3_text",
    )  # fmt: skip


CATALOG: dict[str, ModelArgs] = {
    "demo-tiny": ModelArgs(
        vocab_size=384,
        dim=192,
        num_layers=4,
        num_heads=6,
        num_kv_heads=2,
        ffn_dim=512,
        max_position_embeddings=512,
        tie_embeddings=True,
    ),
    "llama-2-7b": llama2(4096, 32, 32, 32, 11008),
    "llama-2-70b": llama2(8192, 80, 64, 8, 28672),
    "llama-3-8b": llama3(4096, 32, 32, 14336, None),
    "llama-3-70b": llama3(8192, 80, 64, 28672, None),
    "llama-3.1-8b": llama3(4096, 32, 32, 14336, LLAMA31_ROPE),
    "llama-3.1-70b": llama3(8192, 80, 64, 28672, LLAMA31_ROPE),
    "llama-3.2-1b": llama3(2048, 16, 32, 8192, LLAMA32_ROPE, tied=True),
    "llama-3.2-3b": llama3(3072, 28, 24, 8192, LLAMA32_ROPE, tied=True),
    "qwen2.5-7b": qwen25(3584, 28, 28, 4, 18944),
    "qwen2.5-72b": qwen25(8192, 80, 64, 8, 29568),
    "qwen3-0.6b": qwen3(1024, 28, 16, 8, 3072, tied=True),
    "qwen3-1.7b": qwen3(2048, 28, 16, 8, 6144, tied=True),
    "qwen3-4b": qwen3(2560, 36, 32, 8, 9728, tied=True),
    "qwen3-8b": qwen3(4096, 36, 32, 8, 12288, tied=False),
    "qwen3-14b": qwen3(5120, 40, 40, 8, 17408, tied=False),
    "qwen3-32b": qwen3(5120, 64, 64, 8, 25600, tied=False),
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
    "gemma-3-1b": gemma3(262144, 1152, 26, 4, 1, 6912, 256, 256, 512, scaled=False),
    "gemma-3-4b": gemma3(262208, 2560, 34, 8, 4, 10240, 256, 256, 1024, scaled=True),
    "gemma-3-12b": gemma3(262208, 3840, 48, 16, 8, 15360, 256, 256, 1024, scaled=True),
    "gemma-3-27b": gemma3(262208, 5376, 62, 32, 16, 21504, 128, 168, 1024, scaled=True),
    "mistral-7b-v0.1": mistral(32000, 10000.0, 4096),
    "mistral-7b-v0.3": mistral(32768, 1000000.0, None),
    "mixtral-8x7b": mixtral(32000, 4096, 32, 32, 14336, 32768),
    "mixtral-8x22b": mixtral(32768, 6144, 56, 48, 16384, 65536),
    "qwen3-30b-a3b": qwen3_moe(2048, 48, 32, 4, 6144, 768),
    "qwen3-235b-a22b": qwen3_moe(4096, 94, 64, 4, 12288, 1536),
}


class UnknownShapeError(TuneforgeError, KeyError):
    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


def catalog_shape(name: str) -> ModelArgs:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise UnknownShapeError(
            f"unknown model shape '{name}' (a model name without a slash is a catalog shape); "
            f"known shapes: {known}. For a model directory, give model.path"
        ) from None
