"""DeepSeek-V2's multi-head latent attention over packed documents: each token's keys and values
come from one compressed latent (`kv_a_proj_with_mqa` → RMSNorm → `kv_b_proj`, per head a
non-rotary key part and a value), and one rotary key part of `rope_dim` that every head shares;
queries are projected straight from the hidden state (V2-Lite) or through their own compressed
latent. The rotary parts turn adjacent pairs; the softmax scale is 1/√(nope + rope), times
YaRN's mscale² where the configuration has it. Module names are the checkpoint's."""

import torch
from torch import nn

from tuneforge.models.args import ModelArgs, YarnScaling
from tuneforge.models.attention import BACKENDS
from tuneforge.models.kv_cache import LayerCache
from tuneforge.models.norm import RMSNorm
from tuneforge.models.rope import apply_rotary_interleaved
from tuneforge.packed import PackedSequences

LATENT_NORM_EPS = 1e-6
"""transformers builds the latents' norms with their default epsilon, not the config's."""


class LatentAttention(nn.Module):
    def __init__(self, args: ModelArgs, backend: str) -> None:
        super().__init__()
        mla = args.latent_attention
        assert mla is not None
        self.num_heads, self.mla = args.num_heads, mla
        heads, bias = args.num_heads, args.attention_bias
        if mla.q_rank is None:
            self.q_proj = nn.Linear(args.dim, heads * args.head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(args.dim, mla.q_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_rank, heads * args.head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(args.dim, mla.kv_rank + mla.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(mla.kv_rank, heads * (mla.nope_dim + mla.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * mla.v_dim, args.dim, bias=bias)
        scaling = args.rope_scaling
        factor = scaling.softmax_factor if isinstance(scaling, YarnScaling) else 1.0
        self.scale = args.head_dim**-0.5 * factor
        self.window = None
        self.backend = backend

    def queries(self, x_TD: torch.Tensor) -> torch.Tensor:
        if self.mla.q_rank is None:
            return self.q_proj(x_TD)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_TD)))

    def forward(
        self,
        x_TD: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        packed: PackedSequences,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        mla, tokens, heads = self.mla, x_TD.shape[0], self.num_heads
        q = self.queries(x_TD).view(tokens, heads, mla.nope_dim + mla.rope_dim)
        q_nope, q_rope = q.split([mla.nope_dim, mla.rope_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x_TD).split([mla.kv_rank, mla.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(tokens, heads, -1)
        k_nope, v = kv.split([mla.nope_dim, mla.v_dim], dim=-1)
        q_rope = apply_rotary_interleaved(q_rope, *rope)
        k_rope = apply_rotary_interleaved(k_rope.view(tokens, 1, mla.rope_dim), *rope)
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(tokens, heads, mla.rope_dim)], dim=-1)
        v = v.contiguous()
        if cache is None:
            out = BACKENDS[self.backend](q, k, v, packed, None, self.scale)
        else:
            out = cache.attend(q, k, v, packed, None, self.scale)
        return self.o_proj(out.reshape(tokens, heads * mla.v_dim))
