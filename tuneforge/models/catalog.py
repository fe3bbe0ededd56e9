"""Named shapes of real models (and the demo), buildable with random weights as proxies."""

from tuneforge.models.args import ModelArgs

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
    "llama-2-7b": ModelArgs(
        vocab_size=32000,
        dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        ffn_dim=11008,
        norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
    ),
    "llama-2-70b": ModelArgs(
        vocab_size=32000,
        dim=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        ffn_dim=28672,
        norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
    ),
    "llama-3-8b": ModelArgs(
        vocab_size=128256,
        dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        ffn_dim=14336,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    "llama-3-70b": ModelArgs(
        vocab_size=128256,
        dim=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        ffn_dim=28672,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
}


def catalog_shape(name: str) -> ModelArgs:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise KeyError(f"unknown model shape '{name}'; known shapes: {known}") from None
