"""The shape of a decoder: everything needed to build it and to count its cost."""

from dataclasses import dataclass, replace


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
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    family: str = "llama"

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    def with_layers(self, num_layers: int | None) -> "ModelArgs":
        return self if num_layers is None else replace(self, num_layers=num_layers)

    def num_params(self) -> int:
        """Parameter count of the module this shape builds (tied embeddings counted once)."""
        attention = self.dim * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.dim * self.ffn_dim
        block = attention + mlp + 2 * self.dim
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.num_layers * block + embeddings + self.dim

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), attention included."""
        dense = self.num_params() - self.vocab_size * self.dim * (0 if self.tie_embeddings else 1)
        attention = 2 * self.num_layers * self.num_heads * self.head_dim * seq_len
        return 3 * (2 * dense + attention)
