"""What llama.cpp's converter does differently per architecture, for `gguf_file.py`: its name for
each family, the tensors it rewrites (Llama's rotary rows, Gemma's norms, DeepSeek-V2's
`kv_b_proj` split in two) and the metadata beyond the common keys."""

from collections.abc import Iterator

import torch

from tuneforge.models.args import LinearScaling, ModelArgs, YarnScaling

ARCHITECTURES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
    "mistral": "llama", "mixtral": "llama", "gemma3_text": "gemma3", "deepseek_v2": "deepseek2",
}  # fmt: skip
"""llama.cpp runs Mistral and Mixtral as `llama` (its converter maps both there)."""
GEMMA3_LOCAL_PATTERN = 6
"""llama.cpp's `gemma3` takes every sixth layer as global, the rest local."""


def permute_for_llama(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from rotate-half order (pairs i, i + d/2) to interleaved (2i, 2i + 1)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def rewritten(
    args: ModelArgs, hf_name: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensor (or tensors) llama.cpp's converter writes for one HF tensor."""
    if args.gemma is not None and hf_name.endswith("norm.weight"):
        yield hf_name, tensor + 1.0  # llama.cpp's Gemma norms scale by the weight, not 1 + it
        return
    mla = args.latent_attention
    if mla is not None and hf_name.endswith("kv_b_proj.weight"):
        # for attention over the latent: per head the key part transposed and the value part
        per_head = tensor.view(args.num_heads, mla.nope_dim + mla.v_dim, mla.kv_rank)
        keys, values = per_head.split([mla.nope_dim, mla.v_dim], dim=1)
        yield hf_name.replace("kv_b_proj", "k_b_proj"), keys.transpose(1, 2).contiguous()
        yield hf_name.replace("kv_b_proj", "v_b_proj"), values.contiguous()
        return
    if ARCHITECTURES.get(args.family) == "llama":
        if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = permute_for_llama(tensor, args.num_heads)
        elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = permute_for_llama(tensor, args.num_kv_heads)
    yield hf_name, tensor


def add_family_metadata(writer, args: ModelArgs) -> None:
    """Sliding windows, rotary scaling other than Llama 3's, latent attention, shared experts."""
    import gguf

    if args.sliding_window is not None and args.gemma is not None:
        writer.add_sliding_window(args.sliding_window)
        writer.add_rope_freq_base_swa(args.gemma.local_rope_theta)
    scaling = args.rope_scaling
    if isinstance(scaling, LinearScaling):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling.factor)
    elif isinstance(scaling, YarnScaling):
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling.factor)
        writer.add_rope_scaling_orig_ctx_len(scaling.original_max_position_embeddings)
        writer.add_rope_scaling_yarn_beta_fast(scaling.beta_fast)
        writer.add_rope_scaling_yarn_beta_slow(scaling.beta_slow)
        if scaling.mscale_all_dim:
            writer.add_rope_scaling_yarn_log_mul(0.1 * scaling.mscale_all_dim)
    mla = args.latent_attention
    if mla is not None:  # attention over the latent, as one key-value head (llama.cpp's MLA)
        writer.add_head_count_kv(1)
        if mla.q_rank is not None:
            writer.add_q_lora_rank(mla.q_rank)
        writer.add_kv_lora_rank(mla.kv_rank)
        writer.add_key_length(mla.kv_rank + mla.rope_dim)
        writer.add_value_length(mla.kv_rank)
        writer.add_key_length_mla(mla.nope_dim + mla.rope_dim)
        writer.add_value_length_mla(mla.v_dim)
        writer.add_rope_dimension_count(mla.rope_dim)
    moe = args.moe
    if moe is not None and mla is not None:
        writer.add_leading_dense_block_count(len(moe.mlp_only_layers))
        writer.add_expert_shared_count(moe.shared_experts)
        writer.add_expert_weights_scale(moe.routed_scaling)
        if moe.norm_topk_prob:
            writer.add_expert_weights_norm(True)
