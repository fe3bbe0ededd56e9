"""The fields of a Hugging Face `config.json` each family names its own way: rotary scaling,
experts, latent attention (DeepSeek-V2), Gemma 3's layers."""

from dataclasses import replace
from typing import Any

from tuneforge.models.args import (
    GemmaArgs,
    LatentAttentionArgs,
    LinearScaling,
    ModelArgs,
    MoEArgs,
    RopeScaling,
    YarnScaling,
)
from tuneforge.models.errors import ModelError

Scaling = RopeScaling | YarnScaling | LinearScaling


def rope_from_config(config: dict[str, Any]) -> tuple[float, Scaling | None]:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, LinearScaling(float(rope["factor"]))
    if kind == "yarn":
        return theta, YarnScaling(
            factor=float(rope["factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            beta_fast=float(rope.get("beta_fast") or 32.0),
            beta_slow=float(rope.get("beta_slow") or 1.0),
            mscale=float(rope.get("mscale") or 0.0),
            mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
        )
    if kind == "llama3":
        return theta, RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    raise ModelError(
        f"rope scaling '{kind}' is not supported (supported: default, linear, llama3, yarn)"
    )


def rope_parameters(theta: float, scaling: Scaling | None) -> dict[str, Any]:
    """`rope_parameters` as transformers 5 writes them."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if isinstance(scaling, LinearScaling):
        rope |= {"rope_type": "linear", "factor": scaling.factor}
    elif isinstance(scaling, RopeScaling):
        rope |= {
            "rope_type": "llama3", "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }  # fmt: skip
    elif isinstance(scaling, YarnScaling):
        rope |= {
            "rope_type": "yarn", "factor": scaling.factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
            "beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow,
            "mscale": scaling.mscale, "mscale_all_dim": scaling.mscale_all_dim,
        }  # fmt: skip
    return rope


def gemma_from_config(config: dict[str, Any]) -> tuple[GemmaArgs, float, Scaling | None]:
    """Gemma 3's own fields, the global layers' rotary base and scaling: its rotary parameters
    are per kind of layer."""
    layers = config["num_hidden_layers"]
    pattern = int(config.get("sliding_window_pattern") or 6)
    types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    rope = config.get("rope_parameters") or {}
    theta, scaling = rope_from_config({"rope_parameters": rope.get("full_attention") or {}})
    local = (rope.get("sliding_attention") or {}).get("rope_theta") or config.get(
        "rope_local_base_freq", 10000.0
    )
    gemma = GemmaArgs(
        query_pre_attn_scalar=int(config.get("query_pre_attn_scalar") or 256),
        layer_types=tuple(types),
        local_rope_theta=float(local),
    )
    return gemma, float(config.get("rope_theta") or theta), scaling


def gemma_config(args: ModelArgs) -> dict[str, Any]:
    gemma = args.gemma
    assert gemma is not None
    rope = {
        "full_attention": rope_parameters(args.rope_theta, args.rope_scaling),
        "sliding_attention": rope_parameters(gemma.local_rope_theta, None),
    }
    return {
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": gemma.query_pre_attn_scalar,
        "layer_types": list(gemma.layer_types[: args.num_layers]), "rope_parameters": rope,
        "sliding_window": args.sliding_window, "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }  # fmt: skip


def num_experts(config: dict[str, Any]) -> int:
    # Hub checkpoints write `num_experts`; transformers 5 writes its alias `num_local_experts`;
    # DeepSeek's `n_routed_experts`.
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(key):
            return int(config[key])
    return 0


def latent_from_config(config: dict[str, Any]) -> LatentAttentionArgs:
    return LatentAttentionArgs(
        kv_rank=config["kv_lora_rank"],
        nope_dim=config["qk_nope_head_dim"],
        rope_dim=config["qk_rope_head_dim"],
        v_dim=config["v_head_dim"],
        q_rank=config.get("q_lora_rank"),
    )


def deepseek_config(args: ModelArgs) -> dict[str, Any]:
    mla, moe = args.latent_attention, args.moe
    assert mla is not None
    config: dict[str, Any] = {
        "kv_lora_rank": mla.kv_rank, "q_lora_rank": mla.q_rank,
        "qk_nope_head_dim": mla.nope_dim, "qk_rope_head_dim": mla.rope_dim,
        "v_head_dim": mla.v_dim, "head_dim": mla.rope_dim,
    }  # fmt: skip
    if moe is not None:
        dense = len(moe.mlp_only_layers)
        config |= {
            "n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": moe.expert_ffn_dim, "n_shared_experts": moe.shared_experts,
            "first_k_dense_replace": dense, "routed_scaling_factor": moe.routed_scaling,
            "norm_topk_prob": moe.norm_topk_prob, "topk_method": "greedy",
            "aux_loss_alpha": moe.router_aux_loss_coef,
        }  # fmt: skip
    return config


def moe_from_config(config: dict[str, Any], style: str) -> MoEArgs:
    common = MoEArgs(
        num_experts=num_experts(config),
        top_k=config["num_experts_per_tok"],
        expert_ffn_dim=config.get("moe_intermediate_size") or config["intermediate_size"],
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        router_aux_loss_coef=float(config.get("router_aux_loss_coef", 0.001)),
    )
    if style == "mixtral":
        return replace(common, expert_ffn_dim=config["intermediate_size"], norm_topk_prob=True)
    if style == "deepseek":
        method = config.get("topk_method") or "greedy"
        if method != "greedy":
            raise ModelError(
                f"topk_method '{method}' is not supported (DeepSeek-V2-Lite's greedy is)"
            )
        return replace(
            common,
            router_aux_loss_coef=float(config.get("aux_loss_alpha", 0.001)),
            mlp_only_layers=tuple(range(int(config.get("first_k_dense_replace") or 0))),
            shared_experts=int(config.get("n_shared_experts") or 0),
            routed_scaling=float(config.get("routed_scaling_factor") or 1.0),
        )
    return replace(
        common,
        decoder_sparse_step=int(config.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
    )
