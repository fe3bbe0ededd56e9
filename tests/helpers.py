"""Tiny random Hugging Face models saved in the HF layout, for parity tests."""

from pathlib import Path

import torch
import transformers

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3_rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "output_router_logits": True,
        },
    ),
}


def save_tiny_model(directory: Path, family: str = "llama", seed: int = 0, **overrides):
    """Build a random 2-layer transformers model of `family`, save it, return it in eval mode."""
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**(COMMON | extra | overrides))
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # random norms and biases, so that their loading is tested too
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "bias")):
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    model.save_pretrained(directory)
    return model


def save_tiny_llama(directory: Path, seed: int = 0, **overrides):
    return save_tiny_model(directory, "llama", seed, **overrides)


def packed_batch(tokens, labels, packed):
    """A `PackedBatch` of `tokens` with their `labels`, every label not ignored counted as
    supervised."""
    from tuneforge.data.packing import IGNORE_INDEX, PackedBatch

    return PackedBatch(tokens, labels, packed, int((labels != IGNORE_INDEX).sum()))
