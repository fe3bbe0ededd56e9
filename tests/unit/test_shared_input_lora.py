"""Adapters reading the same input computed together (`SharedInputLoRA`) against each adapter's
plain expression, which autograd differentiates."""

import copy

import pytest
import torch
from torch import nn

from tests.helpers import save_tiny_llama
from tuneforge.models.api import load_model, save_model
from tuneforge.models.decoder import project_each
from tuneforge.peft.apply import apply_lora, merge_lora
from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.shared_input_lora import SharedInputLoRA
from tuneforge.peft.stacked_weights import stack_frozen_weights

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


def forward_backward(layers: list[LoRALinear], x: torch.Tensor, together: bool, call=None):
    """Outputs, the input's gradient and the adapters' gradients of `call` (by default the
    layers applied to `x` together) under a weighted sum of the outputs."""
    for layer in layers:
        layer.fused = together
        layer.lora_A.grad = layer.lora_B.grad = None
    x = x.detach().requires_grad_()
    outputs = call(x) if call is not None else project_each(x, *layers)
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
@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("alphas", [None, (9, 3, 17)])
def test_together_equals_each_adapter_alone(dtype, bias, stack, alphas):
    layers = adapters(dtype, bias)
    if alphas is not None:  # a scaling of its own per adapter (folded into a stacked B)
        for layer, alpha in zip(layers, alphas, strict=True):
            layer.scaling = alpha / layer.rank
    computed = layers
    if stack:
        computed = stacked_copy(layers)
        assert computed[1].base.weight.untyped_storage().data_ptr() == (
            computed[0].stacked_weight.untyped_storage().data_ptr()
        )
    x = torch.randn(2, 30, 48, dtype=dtype)
    assert_close(
        forward_backward(computed, x, together=True),
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


@pytest.mark.parametrize("stack", [False, True])
def test_a_compiled_graph_matches_eager_without_breaks(stack):
    layers = adapters(torch.float32, bias=True)
    if stack:
        layers = stacked_copy(layers)
    x = torch.randn(30, 48)

    def project(x):
        return project_each(x, *layers)

    explanation = torch._dynamo.explain(project)(x.clone().requires_grad_())
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    eager = forward_backward(layers, x, together=True)
    compiled = torch.compile(project, fullgraph=True)
    got = forward_backward(layers, x, together=True, call=compiled)
    for a, b in zip(got, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def stacked_copy(layers: list[LoRALinear]) -> list[LoRALinear]:
    """The same adapters in an attention-like module, their frozen weights stacked."""
    holder = nn.Module()
    for name, layer in zip(("q_proj", "k_proj", "v_proj"), layers, strict=True):
        setattr(holder, name, copy.deepcopy(layer))
    assert stack_frozen_weights(holder) == 1
    return [holder.q_proj, holder.k_proj, holder.v_proj]


def test_stacking_keeps_names_values_and_saves():
    layers = adapters(torch.float32, bias=True)
    before = {f"{i}.{k}": v.clone() for i, layer in enumerate(layers)
              for k, v in layer.state_dict().items()}  # fmt: skip
    stacked = stacked_copy(layers)
    after = {f"{i}.{k}": v for i, layer in enumerate(stacked)
             for k, v in layer.state_dict().items()}  # fmt: skip
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    stacked[1].base.weight.add_(1.0)  # a merge writes through its view into the stacked tensor
    rows = stacked[0].base.out_features
    torch.testing.assert_close(
        stacked[0].stacked_weight[rows : rows + stacked[1].base.out_features],
        stacked[1].base.weight,
    )


def test_moving_a_stacked_linear_drops_the_stacked_tensor():
    stacked = stacked_copy(adapters(torch.float32, bias=False))
    stacked[0].to(torch.float64)
    assert stacked[0].stacked_weight is None
    x = torch.randn(5, 48, dtype=torch.float64)
    for layer in stacked:
        layer.to(torch.float64)
    for y, layer in zip(project_each(x, *stacked), stacked, strict=True):
        torch.testing.assert_close(
            y, layer.base(x) + layer.scaling * x @ (layer.lora_B @ layer.lora_A).t()
        )


def test_only_plain_frozen_adapters_of_one_kind_stack():
    holder = nn.Module()
    for name, layer in zip(("q_proj", "k_proj", "v_proj"), adapters(torch.float32, bias=False),
                           strict=True):  # fmt: skip
        setattr(holder, name, layer)
    holder.k_proj.base.weight.requires_grad_(True)  # a trained base weight
    assert stack_frozen_weights(holder) == 0
    holder.k_proj.base.weight.requires_grad_(False)
    holder.v_proj = holder.v_proj.base  # not an adapter
    assert stack_frozen_weights(holder) == 0


def test_a_stacked_model_matches_the_plain_one_then_merges_and_saves(tmp_path):
    save_tiny_llama(tmp_path / "base")
    lora = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "rank": 4, "alpha": 8}
    models = []
    for stack in (False, True):
        model = load_model(tmp_path / "base", dtype="float32")
        apply_lora(model, lora, torch.Generator().manual_seed(0), torch.float32)
        torch.manual_seed(1)
        for param in model.parameters():
            if param.requires_grad:
                nn.init.normal_(param, std=0.1)
        if stack:
            assert stack_frozen_weights(model) == model.args.num_layers
        models.append(model)
    plain, stacked = models
    tokens = torch.randint(0, plain.args.vocab_size, (2, 12))
    expected = plain(tokens)
    torch.testing.assert_close(stacked(tokens), expected, rtol=1e-5, atol=1e-5)
    save_model(merge_lora(stacked), tmp_path / "merged")
    reloaded = load_model(tmp_path / "merged", dtype="float32")
    torch.testing.assert_close(reloaded(tokens), expected, rtol=1e-4, atol=1e-4)
