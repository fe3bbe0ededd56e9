"""The shape of a decoder: everything needed to build it and to count its cost."""

import math
from dataclasses import dataclass, replace

from tuneforge.mesh_rules import SplitSizes
from tuneforge.models.errors import ModelError


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 frequency scaling for long context (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LinearScaling:
    """Positions divided by `factor` (`rope_type: linear`; Gemma 3's global layers)."""

    factor: float


@dataclass(frozen=True)
class GemmaArgs:
    """What Gemma 3 does differently from Llama: RMSNorm scaling by 1 + weight, embeddings
    times √dim, a norm after attention and after the MLP as well as before, GELU (tanh), the
    softmax scaled by `query_pre_attn_scalar`^-½, and local layers (a sliding window, their own
    rotary base, no scaling) between global ones (`layer_types`)."""

    query_pre_attn_scalar: int
    layer_types: tuple[str, ...]
    """Per layer `sliding_attention` or `full_attention`."""
    local_rope_theta: float = 10000.0


@dataclass(frozen=True)
class YarnScaling:
    """YaRN rotary scaling (`rope_type: yarn`, DeepSeek-V2): frequencies between interpolation
    and extrapolation along a ramp, and the rotary part scaled by `attention_factor`."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0

    @staticmethod
    def _mscale(factor: float, mscale: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    @property
    def attention_factor(self) -> float:
        """What cos and sin are multiplied by."""
        if self.mscale and self.mscale_all_dim:
            return self._mscale(self.factor, self.mscale) / self._mscale(
                self.factor, self.mscale_all_dim
            )
        return self._mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """What DeepSeek-V2 multiplies the attention's softmax scale by (mscale_all_dim's)."""
        return self._mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


@dataclass(frozen=True)
class LatentAttentionArgs:
    """Multi-head latent attention (DeepSeek-V2): keys and values made per head from one
    compressed latent of `kv_rank` per token (`kv_a_proj_with_mqa` → norm → `kv_b_proj`), beside
    one rotary key part of `rope_dim` shared by the heads; queries straight from the hidden
    state (`q_rank` None: V2-Lite) or through their own compression."""

    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    q_rank: int | None = None


@dataclass(frozen=True)
class MoEArgs:
    """Sparse mixture-of-experts MLP (Qwen3-MoE): softmax router, top-k experts."""

    num_experts: int
    top_k: int
    expert_ffn_dim: int
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_experts: int = 0
    """Experts every token goes through (DeepSeek-V2): one MLP this many experts wide."""
    routed_scaling: float = 1.0
    """The routed experts' weights multiplied by it (DeepSeek-V2's `routed_scaling_factor`)."""

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_dim: int
    head_dim: int = 0
    """Per-head width; 0 means dim // num_heads."""
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | YarnScaling | LinearScaling | None = None
    tie_embeddings: bool = False
    attention_bias: bool = False
    """Bias on q/k/v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm on each head of q and k before rotary (Qwen3)."""
    moe: MoEArgs | None = None
    max_position_embeddings: int = 4096
    latent_attention: LatentAttentionArgs | None = None
    """DeepSeek-V2's attention; `head_dim` is then its query and key width (nope + rope)."""
    sliding_window: int | None = None
    """Each token attends to itself and the W - 1 tokens before it (Mistral, Mixtral; Gemma 3's
    local layers); None: to every token before it."""
    gemma: GemmaArgs | None = None
    family: str = "llama"

    def __post_init__(self) -> None:
        mla = self.latent_attention
        if mla is not None:
            object.__setattr__(self, "head_dim", mla.nope_dim + mla.rope_dim)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ModelError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    def split_sizes(self) -> SplitSizes:
        """What tensor and expert parallelism split of this model (`mesh_rules.py`)."""
        return SplitSizes(
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            ffn_dim=self.ffn_dim,
            experts=self.moe.num_experts if self.moe is not None else 0,
            latent_attention=self.latent_attention is not None,
        )

    def with_layers(self, num_layers: int | None) -> "ModelArgs":
        return self if num_layers is None else replace(self, num_layers=num_layers)

    def window(self, layer: int) -> int | None:
        """The attention window of `layer` (None: unbounded)."""
        if self.gemma is not None and not self.is_local_layer(layer):
            return None
        return self.sliding_window

    @property
    def norms(self) -> int:
        """RMSNorms per block: before attention and MLP, and with Gemma 3 after them too."""
        return 4 if self.gemma is not None else 2

    def is_local_layer(self, layer: int) -> bool:
        """A Gemma 3 layer with a sliding window and the local rotary base."""
        return self.gemma is not None and self.gemma.layer_types[layer] == "sliding_attention"

    @property
    def windowed(self) -> bool:
        return any(self.window(layer) is not None for layer in range(self.num_layers))

    @property
    def rotary_dim(self) -> int:
        """The width rotary positions turn: a head's, or latent attention's rotary part."""
        mla = self.latent_attention
        return self.head_dim if mla is None else mla.rope_dim

    @property
    def value_dim(self) -> int:
        mla = self.latent_attention
        return self.head_dim if mla is None else mla.v_dim

    @property
    def plain_attention(self) -> bool:
        """Every layer is causal attention over the whole document with equal q, k and v widths
        and the default softmax scale (what FlashAttention-4's path takes here)."""
        return not self.windowed and self.latent_attention is None and self.gemma is None

    def is_sparse_layer(self, layer: int) -> bool:
        return self.moe is not None and self.moe.is_sparse(layer)

    def attention_params(self) -> int:
        mla = self.latent_attention
        if mla is not None:
            heads = self.num_heads
            if mla.q_rank is None:
                queries = self.dim * heads * self.head_dim
            else:
                queries = self.dim * mla.q_rank + mla.q_rank + mla.q_rank * heads * self.head_dim
            latent = self.dim * (mla.kv_rank + mla.rope_dim) + mla.kv_rank
            expand = mla.kv_rank * heads * (mla.nope_dim + mla.v_dim)
            return queries + latent + expand + heads * mla.v_dim * self.dim
        projections = self.dim * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        bias = (
            self.head_dim * (self.num_heads + 2 * self.num_kv_heads) if self.attention_bias else 0
        )
        norms = 2 * self.head_dim if self.qk_norm else 0
        return projections + bias + norms

    def mlp_params(self, layer: int, active: bool = False) -> int:
        """Parameters of one layer's MLP; `active` counts only the experts a token uses."""
        if not self.is_sparse_layer(layer):
            return 3 * self.dim * self.ffn_dim
        assert self.moe is not None
        experts = self.moe.top_k if active else self.moe.num_experts
        experts += self.moe.shared_experts
        return experts * 3 * self.dim * self.moe.expert_ffn_dim + self.moe.num_experts * self.dim

    def num_params(self, active: bool = False) -> int:
        """Parameter count of the module this shape builds (tied embeddings counted once);
        `active=True` counts only the experts each token is routed to."""
        blocks = sum(
            self.attention_params() + self.mlp_params(layer, active) + self.norms * self.dim
            for layer in range(self.num_layers)
        )
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return blocks + embeddings + self.dim
