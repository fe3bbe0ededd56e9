"""The SwiGLU MLP with fused adapters on all three linears (`LoRASwiGLUMLP`) against the plain
expressions of its `LoRALinear`s, which autograd differentiates."""

import pytest
import torch
from torch import nn

from tuneforge.models.decoder import MLP
from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.lora_mlp import LoRASwiGLUMLP

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def adapted_mlp(dtype: torch.dtype, ranks=(8, 4, 16)) -> MLP:
    torch.manual_seed(0)
    mlp = MLP(24, 40).to(dtype).requires_grad_(False)
    for name, rank in zip(("gate_proj", "up_proj", "down_proj"), ranks, strict=True):
        layer = LoRALinear(getattr(mlp, name), rank=rank, alpha=rank + 3, dtype=torch.float32)
        nn.init.normal_(layer.lora_B, std=0.2)
        setattr(mlp, name, layer)
    return mlp


def adapters(mlp: MLP) -> list[LoRALinear]:
    return [mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def forward_backward(mlp: MLP, x: torch.Tensor, fused: bool, run=None):
    for layer in adapters(mlp):
        layer.fused = fused
        layer.lora_A.grad = layer.lora_B.grad = None
    x = x.detach().requires_grad_()
    y = (mlp if run is None else run)(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    grads = [g for layer in adapters(mlp) for g in (layer.lora_A.grad, layer.lora_B.grad)]
    return [y, x.grad, *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mlp_equals_the_plain_expressions(dtype):
    mlp = adapted_mlp(dtype)
    x = torch.randn(3, 11, 24, dtype=dtype)
    fused, plain = forward_backward(mlp, x, True), forward_backward(mlp, x, False)
    for index, (a, b) in enumerate(zip(fused, plain, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, index
        error = (a.float() - b.float()).abs().max() / b.float().abs().max()
        assert error < TOLERANCE[dtype], (index, error)


def test_fused_mlp_runs_only_with_three_fused_adapters():
    calls = []
    original = torch.autograd.Function.apply.__func__

    def spy(cls, *args):
        calls.append(cls)
        return original(cls, *args)

    mlp = adapted_mlp(torch.float32)
    LoRASwiGLUMLP.apply = classmethod(spy)
    try:
        x = torch.randn(5, 24)
        mlp(x)
        assert calls == [LoRASwiGLUMLP]
        mlp.up_proj.dropout.p = 0.1  # not fused: each linear alone
        mlp(x)
        assert calls == [LoRASwiGLUMLP]
        mlp.up_proj.dropout.p = 0.0
        mlp.gate_proj = mlp.gate_proj.base  # a plain linear among them
        mlp(x)
        assert calls == [LoRASwiGLUMLP]
    finally:
        del LoRASwiGLUMLP.apply


def test_no_input_gradient_when_the_input_needs_none():
    mlp = adapted_mlp(torch.float32)
    x = torch.randn(5, 24)
    mlp(x).sum().backward()
    assert x.grad is None
    assert all(layer.lora_A.grad.abs().sum() > 0 for layer in adapters(mlp))


def test_a_compiled_mlp_matches_eager_without_breaks():
    mlp = adapted_mlp(torch.float32)
    x = torch.randn(30, 24)
    explanation = torch._dynamo.explain(mlp)(x.clone().requires_grad_())
    assert explanation.graph_break_count == 0
    code = explanation.graphs[0].print_readable(print_output=False)
    assert "tuneforge.swiglu_low_rank" in code
    torch._dynamo.reset()
    eager = forward_backward(mlp, x, True)
    compiled = forward_backward(mlp, x, True, torch.compile(mlp, fullgraph=True))
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
