"""Catalog shapes against the parameter counts their model cards publish."""

import pytest
import torch

from tuneforge.models.catalog import CATALOG
from tuneforge.models.decoder import Decoder

PUBLISHED_BILLIONS = {
    "llama-2-7b": (6.74, None),
    "llama-2-70b": (68.98, None),
    "llama-3-8b": (8.03, None),
    "llama-3-70b": (70.55, None),
    "llama-3.1-8b": (8.03, None),
    "llama-3.2-1b": (1.24, None),
    "llama-3.2-3b": (3.21, None),
    "qwen2.5-7b": (7.61, None),
    "qwen2.5-72b": (72.7, None),
    "qwen3-0.6b": (0.6, None),
    "qwen3-1.7b": (1.7, None),
    "qwen3-4b": (4.0, None),
    "qwen3-8b": (8.2, None),
    "qwen3-14b": (14.8, None),
    "qwen3-32b": (32.8, None),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "mistral-7b-v0.1": (7.24, None),
    "mistral-7b-v0.3": (7.25, None),
    "mixtral-8x7b": (46.7, 12.9),
    "mixtral-8x22b": (141.0, 39.0),
    "deepseek-v2-lite": (15.7, None),  # its 2.4 B activated: below
    "gemma-3-1b": (1.0, None),
    "gemma-3-27b": (27.0, None),  # the text model (the card's 27.4 B adds the vision tower)
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_parameter_counts_match_the_model_cards(name):
    total, active = PUBLISHED_BILLIONS[name]
    args = CATALOG[name]
    assert args.num_params() / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert args.num_params(active=True) / 1e9 == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.2-1b",
        "qwen2.5-7b",
        "qwen3-4b",
        "qwen3-30b-a3b",
        "mixtral-8x7b",
        "deepseek-v2-lite",
        "gemma-3-4b",
    ],
)
def test_proxy_of_a_real_shape_counts_what_it_builds(name):
    args = CATALOG[name].with_layers(1)
    with torch.device("meta"):
        model = Decoder(args)
    assert args.num_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "name",
    ["mistral-7b-v0.1", "mixtral-8x7b", "deepseek-v2-lite", "gemma-3-4b", "qwen3-30b-a3b"],
)
def test_transformers_builds_the_shape_from_the_config_we_write(name):
    """The config.json written for a shape (a proxy's, as the benchmark's peers build it) makes
    the same model in transformers: the same parameters, layer by layer."""
    import transformers

    from tuneforge.bench.peers import _hf_config
    from tuneforge.bench.workloads import Workload
    from tuneforge.models.hf.adapter import adapter_for

    args = CATALOG[name].with_layers(2)
    config = _hf_config(Workload("proxy", name, None, layers=2))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == adapter_for(args.family).architecture
    assert sum(p.numel() for p in model.parameters()) == args.num_params()
