"""A Llama-style decoder in plain PyTorch: RMSNorm, rotary positions, GQA attention, SwiGLU.

Inputs are packed: a flat stream of tokens [T] with `PackedSequences` describing documents.
"""

import torch
import torch.nn.functional as F
from torch import nn

from tuneforge.models.args import ModelArgs
from tuneforge.models.attention import BACKENDS
from tuneforge.models.packed import PackedSequences


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before scaling, as the reference implementation does.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position angles; frequencies are recomputed in fp32 each call (no buffer to
    lose precision when the model is cast, nothing to re-fill after meta-device init)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(
        self, position_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(
            0, self.head_dim, 2, dtype=torch.float32, device=position_ids.device
        )
        inv_freq = 1.0 / (self.theta ** (exponents / self.head_dim))
        freqs = position_ids.float()[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x_THD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    half = x_THD.shape[-1] // 2
    rotated = torch.cat([-x_THD[..., half:], x_THD[..., :half]], dim=-1)
    return x_THD * cos_TD[:, None, :] + rotated * sin_TD[:, None, :]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, backend: str) -> None:
        super().__init__()
        self.num_heads = args.num_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_proj = nn.Linear(args.dim, args.num_heads * args.head_dim, bias=False)
        self.k_proj = nn.Linear(args.dim, args.num_kv_heads * args.head_dim, bias=False)
        self.v_proj = nn.Linear(args.dim, args.num_kv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.dim, bias=False)
        self.backend = backend

    def forward(
        self, x_TD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], packed: PackedSequences
    ) -> torch.Tensor:
        num_tokens = x_TD.shape[0]
        q = self.q_proj(x_TD).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x_TD).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x_TD).view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = BACKENDS[self.backend](q, k, v, packed)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, backend: str) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.attn = Attention(args, backend)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args.dim, args.ffn_dim)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], packed: PackedSequences
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, packed)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs, attention: str = "sdpa") -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.rope = RotaryEmbedding(args.head_dim, args.rope_theta)
        self.layers = nn.ModuleList(Block(args, attention) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the output head (again after `to_empty`, which unties them)."""
        if self.args.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def set_attention_backend(self, backend: str) -> None:
        for layer in self.layers:
            layer.attn.backend = backend

    def hidden_states(self, tokens: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
        """Final normalised hidden states [T, D] of a flat token stream [T]."""
        x = self.embed(tokens)
        rope = self.rope(packed.position_ids, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, packed)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
        """Logits [T, vocab]. Training uses `hidden_states` and a chunked loss instead."""
        return self.lm_head(self.hidden_states(tokens, packed))

    @torch.no_grad()
    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        """Random initialisation for catalog shapes; residual outputs scaled by depth."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.normal_(0.0, std / (2 * self.args.num_layers) ** 0.5, generator=generator)
            else:
                param.normal_(0.0, std, generator=generator)
