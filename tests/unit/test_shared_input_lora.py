"""Adapters reading the same input computed together (`SharedInputLoRA`) against each adapter's
plain expression, which autograd differentiates."""

import pytest
import torch
from torch import nn

from tuneforge.models.decoder import project_each
from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.shared_input_lora import SharedInputLoRA

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def adapters(dtype, bias: bool, ranks=(8, 4, 4), outs=(64, 16, 16)) -> list[LoRALinear]:
    torch.manual_seed(0)
    layers = []
    for rank, out in zip(ranks, outs, strict=True):
        base = nn.Linear(48, out, bias=bias).to(dtype).requires_grad_(False)
        layer = LoRALinear(base, rank=rank, alpha=2 * rank + 1, dtype=torch.float32)
        nn.init.normal_(layer.lora_B, std=0.1)
        layers.append(layer)
    return layers


def forward_backward(layers: list[LoRALinear], x: torch.Tensor, together: bool):
    for layer in layers:
        layer.fused = together
        layer.lora_A.grad = layer.lora_B.grad = None
    x = x.detach().requires_grad_()
    outputs = project_each(x, *layers)
    loss = sum(
        (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum() * (i + 1)
        for i, y in enumerate(outputs)
    )
    loss.backward()
    grads = [g for layer in layers for g in (layer.lora_A.grad, layer.lora_B.grad)]
    return [*outputs, x.grad, *grads]


def assert_close(got, expected, tolerance):
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, index
        error = (a.float() - b.float()).abs().max() / b.float().abs().max()
        assert error < tolerance, (index, error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_together_equals_each_adapter_alone(dtype, bias):
    layers = adapters(dtype, bias)
    x = torch.randn(2, 30, 48, dtype=dtype)
    assert_close(
        forward_backward(layers, x, together=True),
        forward_backward(layers, x, together=False),
        TOLERANCE[dtype],
    )


def test_the_shared_path_runs_only_where_every_adapter_runs_fused():
    layers = adapters(torch.float32, bias=False, ranks=(4, 4), outs=(16, 16))
    calls = []
    original = torch.autograd.Function.apply.__func__

    def spy(cls, *args):
        calls.append(cls)
        return original(cls, *args)

    SharedInputLoRA.apply = classmethod(spy)
    try:
        x = torch.randn(5, 48)
        project_each(x, *layers)
        assert calls == [SharedInputLoRA]
        layers[1].dropout.p = 0.1  # dropout: not fused, so each alone
        project_each(x, *layers)
        assert calls == [SharedInputLoRA]
        layers[1].dropout.p = 0.0
        project_each(x, layers[0], layers[1].base)  # a plain linear among them
        assert calls == [SharedInputLoRA]
    finally:
        del SharedInputLoRA.apply


def test_no_input_gradient_when_the_input_needs_none():
    layers = adapters(torch.float32, bias=False)
    x = torch.randn(5, 48)
    sum(y.sum() for y in project_each(x, *layers)).backward()
    assert x.grad is None
    assert all(layer.lora_A.grad.abs().sum() > 0 for layer in layers)


def test_a_compiled_graph_matches_eager_without_breaks():
    layers = adapters(torch.float32, bias=True)
    module = nn.ModuleList(layers)
    x = torch.randn(30, 48)

    def project(x):
        return project_each(x, *module)

    explanation = torch._dynamo.explain(project)(x.clone().requires_grad_())
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    eager = forward_backward(layers, x, together=True)
    compiled = torch.compile(project, fullgraph=True)
    for layer in layers:
        layer.lora_A.grad = layer.lora_B.grad = None
    inputs = x.detach().requires_grad_()
    outputs = compiled(inputs)
    sum(
        (y * torch.linspace(-1, 1, y.shape[-1])).sum() * (i + 1) for i, y in enumerate(outputs)
    ).backward()
    got = [*outputs, inputs.grad] + [
        g for layer in layers for g in (layer.lora_A.grad, layer.lora_B.grad)
    ]
    for a, b in zip(got, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
