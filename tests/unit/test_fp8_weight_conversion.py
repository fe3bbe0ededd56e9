"""A base held in FP8 is converted one weight at a time: each 16-bit weight is freed once its
FP8 copy is swapped in, and a weight is quantised in row chunks with the values and scales of
the one-piece quantisation (the oracle)."""

import weakref

import pytest
import torch

from tuneforge.config import load_config
from tuneforge.precision.converters import FrozenLowPrecision, frozen_linears
from tuneforge.precision.fp8 import WEIGHT_CHUNK_ROWS, Fp8Recipe, quantize, quantize_weight
from tuneforge.train.build import build_model


@pytest.mark.parametrize("rowwise", [True, False])
def test_a_weight_quantised_in_chunks_equals_it_quantised_whole(rowwise):
    weight = torch.randn(2 * WEIGHT_CHUNK_ROWS + 77, 64, dtype=torch.bfloat16)
    weight[5] *= 40  # rows of very different magnitudes
    whole, whole_scale = quantize(weight, torch.float8_e4m3fn, rowwise)
    chunked, chunked_scale = quantize_weight(weight, torch.float8_e4m3fn, rowwise)
    assert torch.equal(whole.float(), chunked.float())
    assert torch.equal(whole_scale, chunked_scale)


def test_the_conversion_frees_each_16_bit_weight_once_swapped(monkeypatch):
    config = load_config(
        "examples/demo.yaml",
        ["lora.enabled=true", "model.dtype=bfloat16", "precision.fp8=e4m3",
         "precision.fp8_base_weights=true"],
    )  # fmt: skip
    model = build_model(config.model, torch.device("cpu"), 0).model
    model.requires_grad_(False)
    weights = [weakref.ref(linear.weight) for *_, linear in frozen_linears(model)]
    assert len(weights) == 28
    alive: list[int] = []
    import tuneforge.precision.frozen_linear as frozen_linear

    original = frozen_linear.Fp8Linear.__init__

    def counting(self, *args, **kwargs):
        alive.append(sum(ref() is not None for ref in weights))
        original(self, *args, **kwargs)

    monkeypatch.setattr(frozen_linear.Fp8Linear, "__init__", counting)
    recipe = Fp8Recipe.of("e4m3", "rowwise")
    done = FrozenLowPrecision(config.precision, recipe).convert(model)
    assert sum(done.kinds.values()) == 28
    assert alive == list(range(28, 0, -1))  # the ones not yet converted, and no more
    assert all(ref() is None for ref in weights)
