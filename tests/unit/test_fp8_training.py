"""Full fine-tuning in FP8: the trained linear's output and both gradients against torchao's
float8 training (the reference implementation) on the same recipe, and on a model: the same
parameters and state dict, every projection swapped, and the loss falls."""

import pytest
import torch
from torch import nn

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.api import load_model
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.fp8 import E4M3, Fp8Recipe, dequantize, quantize
from tuneforge.precision.fp8_training import Fp8TrainingLinear


def _torchao_linear(linear: nn.Linear, rowwise: bool) -> nn.Module:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.config import CastConfig, ScalingGranularity
    except Exception as error:  # any import failure means no oracle here
        pytest.skip(f"torchao's float8 does not import here ({error})")
    if rowwise:  # torchao's rowwise recipe without its power-of-two scales: E4M3 throughout
        axiswise = CastConfig(scaling_granularity=ScalingGranularity.AXISWISE)
        config = Float8LinearConfig(
            cast_config_input=axiswise,
            cast_config_weight=axiswise,
            cast_config_grad_output=axiswise,
            round_scales_to_power_of_2=False,
        )
    else:  # torchao's default: tensorwise, E4M3 forward and E5M2 output gradients
        config = Float8LinearConfig()
    model = nn.Sequential(linear)
    convert_to_float8_training(model, config=config)
    return model


def _forward_backward(module: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    x = x.detach().requires_grad_()
    y = module(x)
    y.backward(grad)
    weight = next(module.parameters())
    return y, x.grad, weight.grad


@pytest.mark.parametrize(("fp8", "scaling"), [("hybrid", "tensorwise"), ("e4m3", "rowwise")])
def test_the_products_are_torchaos(fp8, scaling):
    torch.manual_seed(0)
    reference = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    ours = Fp8TrainingLinear(
        nn.Linear(64, 48, bias=False).to(torch.bfloat16), Fp8Recipe.of(fp8, scaling)
    )
    ours.weight.data.copy_(reference.weight.data)
    theirs = _torchao_linear(reference, rowwise=scaling == "rowwise")
    x = torch.randn(96, 64, dtype=torch.bfloat16)
    grad = torch.randn(96, 48, dtype=torch.bfloat16)
    # tensorwise: bit for bit; rowwise: the same quantised operands, the gradients' products
    # rounded to bf16 a unit apart in a quarter of their elements (torchao scales them otherwise)
    ulps = 0 if scaling == "tensorwise" else 2**-7
    results = zip(_forward_backward(ours, x, grad), _forward_backward(theirs, x, grad), strict=True)
    for name, (got, want) in zip(("y", "dx", "dW"), results, strict=True):
        torch.testing.assert_close(got, want, rtol=ulps, atol=0, msg=name)


def test_tokens_that_are_not_whole_gemm_tiles_are_padded_and_the_bias_trains():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    ours = Fp8TrainingLinear(linear, Fp8Recipe.of("e4m3", "rowwise"))
    x = torch.randn(2, 21, 64, dtype=torch.bfloat16)  # 42 tokens
    grad = torch.randn(2, 21, 48, dtype=torch.bfloat16)
    y, dx, dW = _forward_backward(ours, x, grad)
    assert y.shape == (2, 21, 48) and dx.shape == x.shape
    g, rows = grad.reshape(-1, 48), x.reshape(-1, 64)
    gq, gs = quantize(g.t().contiguous(), E4M3, rowwise=True)  # per channel, over the tokens
    xq, xs = quantize(rows.t().contiguous(), E4M3, rowwise=True)
    expected = dequantize(gq, gs, torch.float32) @ dequantize(xq, xs, torch.float32).t()
    torch.testing.assert_close(dW.float(), expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(linear.bias.grad, g.sum(0))


def test_a_full_fine_tune_runs_its_projections_in_fp8_and_learns():
    torch.manual_seed(0)
    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    names = set(model.state_dict())
    report = apply_precision(model, PrecisionSection(fp8="hybrid"))
    layers = len(model.layers)
    assert sum(isinstance(m, Fp8TrainingLinear) for m in model.modules()) == 7 * layers
    assert "(trained): FP8 (E4M3 forward, E5M2 gradients, rowwise)" in report.lines[0]
    assert set(model.state_dict()) == names
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 100, (1, 64), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(8):
        logits = model(tokens[:, :-1]).float()
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def _tiny_model(section: PrecisionSection):
    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    return model, apply_precision(model, section)


def _loss_and_grads(model: nn.Module, tokens: torch.Tensor):
    logits = model(tokens[:, :-1]).float()
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}


def test_torchao_as_the_implementation_runs_the_same_products_as_ours():
    """`fp8_implementation: torchao` swaps every trained projection for torchao's Float8Linear
    with the same recipe; tensorwise, both compute bit for bit the same loss and gradients."""
    pytest.importorskip("torchao.float8", reason="torchao is the implementation under test")
    from torchao.float8.float8_linear import Float8Linear

    section = PrecisionSection(fp8="hybrid", fp8_scaling="tensorwise")
    ours, _ = _tiny_model(section)
    theirs, report = _tiny_model(section.model_copy(update={"fp8_implementation": "torchao"}))
    assert sum(isinstance(m, Float8Linear) for m in theirs.modules()) == 7 * len(theirs.layers)
    assert "through torchao's float8 training (Float8Linear)" in report.lines[0]
    assert set(theirs.state_dict()) == set(ours.state_dict())
    tokens = torch.randint(0, 100, (1, 64), generator=torch.Generator().manual_seed(1))
    loss, grads = _loss_and_grads(ours, tokens)
    their_loss, their_grads = _loss_and_grads(theirs, tokens)
    assert loss.item() == their_loss.item()
    for name, grad in grads.items():
        torch.testing.assert_close(their_grads[name], grad, rtol=0, atol=0, msg=name)


def test_torchao_missing_is_a_clear_error(monkeypatch):
    import builtins

    from tuneforge.errors import TuneforgeError

    real_import = builtins.__import__

    def without_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_torchao)
    with pytest.raises(TuneforgeError, match="pip install torchao"):
        _tiny_model(PrecisionSection(fp8="e4m3", fp8_implementation="torchao"))


def test_torchao_tensorwise_weights_are_gathered_in_fp8_under_fsdp2():
    pytest.importorskip("torchao.float8", reason="the implementation under test")
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    section = PrecisionSection(fp8="e4m3", fp8_scaling="tensorwise", fp8_implementation="torchao")
    report = apply_precision(model, section, sharded=True)
    weights = [model.layers[0].mlp.up_proj.weight, model.layers[0].attn.q_proj.weight]
    assert all(isinstance(w, WeightWithDynamicFloat8CastTensor) for w in weights)
    assert report.lines[-1] == (
        "under FSDP2: trained weights sharded and all-gathered in FP8 (torchao's float8 all-gather)"
    )
    rowwise = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    section = section.model_copy(update={"fp8_scaling": "rowwise"})
    report = apply_precision(rowwise, section, sharded=True)
    assert report.lines[-1].endswith("all-gathered in the model's dtype")


def test_a_model_with_weights_gathered_in_fp8_saves_plain_weights(tmp_path):
    """The final model of a torchao FSDP2 run: its wrapped weights written as their bf16 values."""
    pytest.importorskip("torchao.float8", reason="the implementation under test")
    from safetensors.torch import load_file

    from tuneforge.models.hf.checkpoint import save_hf_model

    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    section = PrecisionSection(fp8="e4m3", fp8_scaling="tensorwise", fp8_implementation="torchao")
    apply_precision(model, section, sharded=True)
    save_hf_model(model, tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    weight = saved["model.layers.1.mlp.down_proj.weight"]
    assert type(weight) is torch.Tensor and weight.dtype == torch.bfloat16
    assert torch.equal(weight, model.layers[1].mlp.down_proj.weight._tensor)
