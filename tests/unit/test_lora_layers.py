"""The LoRA layer against its formula: base(x) + scale · B·A·(dropout(x)) (pre) or
base(x) + dropout(scale · B·A·x) (post), with scale alpha/r or alpha/√r, and A's init."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tuneforge.peft.lora import LoRALinear


def adapted(rank=4, alpha=8.0, dropout=0.0, **options):
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(12, 10), rank, alpha, dropout, **options)
    with torch.no_grad():
        layer.lora_B.normal_()
    return layer


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("use_rslora", [False, True])
def test_output_follows_the_formula(position, use_rslora):
    layer = adapted(dropout=0.3, dropout_position=position, use_rslora=use_rslora).train()
    x = torch.randn(5, 12)
    scale = 8.0 / math.sqrt(4) if use_rslora else 8.0 / 4
    torch.manual_seed(7)
    out = layer(x)
    torch.manual_seed(7)
    A, B = layer.lora_A, layer.lora_B
    if position == "pre":
        update = (F.dropout(x, 0.3) @ A.t() @ B.t()) * scale
    else:
        update = F.dropout((x @ A.t() @ B.t()) * scale, 0.3)
    torch.testing.assert_close(out, layer.base(x) + update)
    torch.testing.assert_close(layer.eval()(x), layer.base(x) + (x @ A.t() @ B.t()) * scale)


def test_gradients_reach_only_what_trains():
    layer = adapted()
    layer.base.requires_grad_(False)
    layer(torch.randn(3, 12)).square().sum().backward()
    assert layer.lora_A.grad is not None and layer.lora_B.grad is not None
    assert layer.base.weight.grad is None and layer.base.bias.grad is None


@pytest.mark.parametrize(
    ("init", "expected_std"),
    [
        ("kaiming", 1 / math.sqrt(512) / math.sqrt(3)),  # uniform ±1/√in
        ("xavier", math.sqrt(2 / (512 + 64))),
        ("gaussian", 1 / 64),
    ],
)
def test_a_is_initialised_as_named_and_b_is_zero(init, expected_std):
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(512, 256), 64, 16.0, init=init)
    assert layer.lora_A.std().item() == pytest.approx(expected_std, rel=0.03)
    assert layer.lora_A.mean().abs().item() < expected_std * 0.05
    assert not layer.lora_B.any()
    if init == "kaiming":
        assert layer.lora_A.abs().max().item() <= 1 / math.sqrt(512)
