"""One decoder for the Llama, Qwen, Mistral, Mixtral, DeepSeek-V2 and Gemma 3 families in plain
PyTorch: RMSNorm (Gemma's too, and its norms after each branch), rotary positions (Gemma's local
layers with their own), GQA attention (optional q/k/v bias, per-head q/k norm, sliding window,
softmax scale) or latent attention (`latent_attention.py`), SwiGLU or GeGLU, or a sparse MoE MLP
(with shared experts).

Inputs are packed: a flat stream of tokens [T] with `PackedSequences` describing documents.
"""

from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from tuneforge.models.args import ModelArgs
from tuneforge.models.attention import BACKENDS
from tuneforge.models.kv_cache import KVCache, LayerCache
from tuneforge.models.latent_attention import LatentAttention
from tuneforge.models.moe import MoE, load_balancing_loss
from tuneforge.models.norm import rms_norm
from tuneforge.models.rope import RotaryEmbedding, apply_rotary
from tuneforge.packed import PackedSequences, to_device


def project_each(x: torch.Tensor, *linears: nn.Module) -> list[torch.Tensor]:
    """Each linear applied to the same input; linears that can compute together (LoRA adapters,
    which then read the input once) have a `project_together`."""
    together = getattr(linears[0], "project_together", None)
    if together is None:
        return [linear(x) for linear in linears]
    return together(x, list(linears))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, backend: str, layer: int = 0) -> None:
        super().__init__()
        self.window = args.window(layer)
        self.num_heads = args.num_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.dim, args.num_heads * args.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.dim, args.num_kv_heads * args.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.dim, args.num_kv_heads * args.head_dim, bias=bias)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.dim, bias=False)
        offset = args.gemma is not None
        if args.qk_norm:
            self.q_norm = rms_norm(args.head_dim, args.norm_eps, offset)
            self.k_norm = rms_norm(args.head_dim, args.norm_eps, offset)
        else:
            self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.scale = None if args.gemma is None else args.gemma.query_pre_attn_scalar**-0.5
        self.backend = backend

    def forward(
        self,
        x_TD: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        packed: PackedSequences,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        num_tokens = x_TD.shape[0]
        q, k, v = project_each(x_TD, self.q_proj, self.k_proj, self.v_proj)
        # heads by the projections' width: under tensor parallelism a rank holds a share of them
        q = self.q_norm(q.view(num_tokens, -1, self.head_dim))
        k = self.k_norm(k.view(num_tokens, -1, self.head_dim))
        # v may be a column slice of q, k and v's one output (stacked weights): saved by the
        # attention as it is, it would keep all three alive until backward
        v = v.contiguous().view(num_tokens, -1, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = (
            BACKENDS[self.backend](q, k, v, packed, self.window, self.scale)
            if cache is None
            else cache.attend(q, k, v, packed, self.window, self.scale)
        )
        return self.o_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, gelu: bool = False) -> None:
        """SwiGLU, or with `gelu` GeGLU (GELU's tanh approximation, Gemma)."""
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project_each(x, self.gate_proj, self.up_proj)
        activated = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(activated * up)


def build_mlp(args: ModelArgs, layer: int) -> nn.Module:
    if args.moe is not None and args.is_sparse_layer(layer):
        shared = args.moe.shared_experts
        width = args.moe.expert_ffn_dim * shared
        return MoE(args.dim, args.moe, shared_experts=MLP(args.dim, width) if shared else None)
    return MLP(args.dim, args.ffn_dim, gelu=args.gemma is not None)


def build_attention(args: ModelArgs, layer: int, backend: str) -> Attention | LatentAttention:
    if args.latent_attention is not None:
        return LatentAttention(args, backend)
    return Attention(args, backend, layer)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, backend: str) -> None:
        super().__init__()
        offset = args.gemma is not None
        self.attn_norm = rms_norm(args.dim, args.norm_eps, offset)
        self.attn = build_attention(args, layer, backend)
        self.mlp_norm = rms_norm(args.dim, args.norm_eps, offset)
        self.mlp = build_mlp(args, layer)
        if args.gemma is not None:  # Gemma 3 also normalises each branch's output
            self.attn_post_norm = rms_norm(args.dim, args.norm_eps, offset)
            self.mlp_post_norm = rms_norm(args.dim, args.norm_eps, offset)
        self.local = args.is_local_layer(layer)
        """Gemma 3's local layers turn with the local rotary base."""

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        packed: PackedSequences,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        attended = self.attn(self.attn_norm(x), rope, packed, cache)
        if hasattr(self, "attn_post_norm"):
            x = x + self.attn_post_norm(attended)
            return x + self.mlp_post_norm(self.mlp(self.mlp_norm(x)))
        x = x + attended
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs, attention: str = "sdpa") -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.rope = RotaryEmbedding(args.rotary_dim, args.rope_theta, args.rope_scaling)
        if args.gemma is not None:
            self.local_rope = RotaryEmbedding(args.rotary_dim, args.gemma.local_rope_theta)
        self.layers = nn.ModuleList(
            Block(args, layer, attention) for layer in range(args.num_layers)
        )
        self.norm = rms_norm(args.dim, args.norm_eps, args.gemma is not None)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        self.source_dir: Path | None = None
        """The Hugging Face directory the weights came from (its tokenizer files travel on save)."""

    def tie_weights(self) -> None:
        """Share the embedding with the output head (again after `to_empty`, which unties them)."""
        if self.args.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @property
    def blocks(self) -> list[Block]:
        """`layers`, typed."""
        return [cast(Block, layer) for layer in self.layers]

    @property
    def attention_backend(self) -> str:
        """The attention backend that runs (`models.attention`), the same in every block."""
        return self.blocks[0].attn.backend

    def set_attention_backend(self, backend: str) -> None:
        for block in self.blocks:
            block.attn.backend = backend

    def hidden_states(
        self, tokens: torch.Tensor, packed: PackedSequences, cache: KVCache | None = None
    ) -> torch.Tensor:
        """Final normalised hidden states [T, D] of a flat token stream [T]. With a cache, each
        document continues its cached sequence and is stored in it."""
        x = self.embed_tokens(tokens)
        rope = self.rope(packed.position_ids, x.dtype)
        local = self.local_rope(packed.position_ids, x.dtype) if self.args.gemma else rope
        for index, layer in enumerate(self.blocks):
            turns = local if layer.local else rope
            x = (
                layer(x, turns, packed, cache.layers[index])
                if cache is not None
                else layer(x, turns, packed)
            )
        if cache is not None:
            cache.advance(packed)
        return self.norm(x)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings on the model's device; an embedding kept in host memory
        (`train.offload_embedding`) is gathered there, from host ids without a wait."""
        weight, device = self.embed.weight, self.lm_head.weight.device
        if weight.device == device:
            embedded = self.embed(tokens)
        else:
            embedded = to_device(F.embedding(tokens.to(weight.device), weight), device)
        if self.args.gemma is None:
            return embedded
        # Gemma scales by √dim rounded to the weights' dtype, as transformers does
        return embedded * torch.tensor(self.args.dim**0.5, dtype=embedded.dtype)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        weight = self.lm_head.weight
        args = self.args
        return KVCache(
            args.num_layers,
            batch,
            args.num_kv_heads,
            capacity,
            args.head_dim,
            weight.dtype,
            weight.device,
            args.value_dim,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """Logits: `[batch, seq]` ids give `[batch, seq, vocab]`; flat `[tokens]` ids with
        `cu_seqlens` (and optionally `position_ids`) give `[tokens, vocab]`.
        Training uses `hidden_states` and a chunked loss instead of full logits."""
        if input_ids.ndim == 2:
            batch, seq = input_ids.shape
            packed = PackedSequences.from_lengths([seq] * batch, input_ids.device)
            return self.lm_head(self.hidden_states(input_ids.reshape(-1), packed)).view(
                batch, seq, -1
            )
        if cu_seqlens is None:
            cu_seqlens = torch.tensor(
                [0, input_ids.numel()], dtype=torch.int32, device=input_ids.device
            )
        packed = PackedSequences.from_cu_seqlens(cu_seqlens, position_ids, max_seqlen)
        return self.lm_head(self.hidden_states(input_ids, packed))

    def _moes(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    def aux_loss(self, real_tokens: torch.Tensor | None = None) -> torch.Tensor | None:
        """Load-balancing loss of the last forward (MoE models only), unscaled; over the first
        `real_tokens` tokens only where given (the rest padding)."""
        moes = self._moes()
        if not moes or any(moe.last_router_logits is None for moe in moes):
            return None
        assert self.args.moe is not None
        logits = [moe.last_router_logits for moe in moes if moe.last_router_logits is not None]
        moe = self.args.moe
        return load_balancing_loss(logits, moe.num_experts, moe.top_k, real_tokens)

    def record_router_logits(self, enabled: bool) -> None:
        """Keep each forward's router logits for `aux_loss` (on), or drop them and keep none
        (off: what training sets between its forward and the next, so that the blocks that
        checkpointing recomputes in backward hold nothing)."""
        for moe in self._moes():
            moe.record_router_logits = enabled
            if not enabled:
                moe.last_router_logits = None

    @torch.no_grad()
    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        """Random initialisation for catalog shapes; residual outputs scaled by depth. The
        values are drawn where `generator` is and copied to each parameter (a base made in host
        memory draws them on the GPU: the same weights, without the CPU's single-threaded draw)."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):  # Gemma's norms scale by 1 + weight
                param.fill_(0.0 if self.args.gemma is not None else 1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                _draw_normal(param, std / (2 * self.args.num_layers) ** 0.5, generator)
            else:
                _draw_normal(param, std, generator)


def _draw_normal(param: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
    drawn_on = generator.device if generator is not None else param.device
    if drawn_on == param.device:
        param.normal_(0.0, std, generator=generator)
    else:
        param.copy_(torch.empty_like(param, device=drawn_on).normal_(0.0, std, generator=generator))
