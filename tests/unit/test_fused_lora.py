"""The fused LoRA linear (two accumulating GEMMs, custom backward) against LoRALinear's plain
expression, which autograd differentiates."""

import pytest
import torch
from torch import nn

from tuneforge.peft.lora import LoRALinear

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def forward_backward(layer: LoRALinear, x: torch.Tensor, fused: bool):
    layer.fused = fused
    for param in (layer.lora_A, layer.lora_B):
        param.grad = None
    x = x.detach().requires_grad_()
    y = layer(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y, x.grad, layer.lora_A.grad, layer.lora_B.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_equals_the_plain_path(dtype, bias):
    torch.manual_seed(0)
    base = nn.Linear(48, 80, bias=bias).to(dtype).requires_grad_(False)
    layer = LoRALinear(base, rank=8, alpha=16, dtype=torch.float32)
    nn.init.normal_(layer.lora_B, std=0.1)
    x = torch.randn(2, 30, 48, dtype=dtype)
    plain = forward_backward(layer, x, fused=False)
    fused = forward_backward(layer, x, fused=True)
    for name, got, expected in zip(("y", "dx", "dA", "dB"), fused, plain, strict=True):
        assert got.dtype == expected.dtype, name
        scale = expected.float().abs().max()
        error = (got.float() - expected.float()).abs().max() / scale
        assert error < TOLERANCE[dtype], name


def test_fused_path_is_skipped_where_it_does_not_apply():
    base = nn.Linear(16, 16).requires_grad_(False)
    layer = LoRALinear(base, rank=4, alpha=8, dropout=0.1, dtype=torch.float32)
    layer.train()
    calls = []
    original = torch.autograd.Function.apply.__func__

    from tuneforge.peft import fused_lora

    def spy(cls, *args):
        calls.append(cls)
        return original(cls, *args)

    fused_lora.FusedLoRALinear.apply = classmethod(spy)
    try:
        layer(torch.randn(3, 16))  # dropout: the plain path
        assert calls == []
        layer.dropout.p = 0.0
        layer(torch.randn(3, 16))
        assert calls == [fused_lora.FusedLoRALinear]
    finally:
        del fused_lora.FusedLoRALinear.apply


def test_no_input_gradient_when_the_input_needs_none():
    base = nn.Linear(16, 24).requires_grad_(False)
    layer = LoRALinear(base, rank=4, alpha=8, dtype=torch.float32)
    nn.init.normal_(layer.lora_B, std=0.1)
    x = torch.randn(5, 16)  # e.g. a frozen embedding's output
    layer(x).sum().backward()
    assert x.grad is None
    assert layer.lora_A.grad is not None and layer.lora_A.grad.abs().sum() > 0


def test_a_compiled_graph_keeps_the_fused_operator_whole_and_matches_eager():
    """torch.compile sees the operator through its registered output shape (no graph break, no
    copy of its output) and the compiled forward and backward give the eager numbers."""
    torch.manual_seed(0)
    base = nn.Linear(48, 80, bias=True).requires_grad_(False)
    layer = LoRALinear(base, rank=8, alpha=16, dtype=torch.float32)
    nn.init.normal_(layer.lora_B, std=0.1)
    layer.fused = True
    x = torch.randn(30, 48)
    explanation = torch._dynamo.explain(layer)(x.clone().requires_grad_())
    assert explanation.graph_break_count == 0
    code = explanation.graphs[0].print_readable(print_output=False)
    assert code.count("tuneforge.matmul_add_low_rank") == 2  # forward and backward
    torch._dynamo.reset()
    eager = forward_backward(layer, x, fused=True)
    compiled_layer = torch.compile(layer, fullgraph=True)
    for param in (layer.lora_A, layer.lora_B):
        param.grad = None
    inputs = x.detach().requires_grad_()
    y = compiled_layer(inputs)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    got = (y, inputs.grad, layer.lora_A.grad, layer.lora_B.grad)
    for name, a, b in zip(("y", "dx", "dA", "dB"), got, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
