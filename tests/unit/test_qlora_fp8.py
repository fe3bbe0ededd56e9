"""QLoRA's 4-bit base multiplied in FP8, on the CPU (the same arithmetic as the GPU's kernel,
which `tests/gpu/test_adapters_gpu.py` checks bit for bit): the E4M3 weights are bitsandbytes'
own dequantised values rounded with a scale per output channel, and the product and its
gradients are the straightforward FP8 reference; the configuration takes `precision.fp8` with
`model.quantize` and refuses the formats that would hold the base twice."""

import pytest
import torch
from torch import nn

pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")

from tests.cli_runs import REPO
from tests.helpers import issues_of
from tuneforge.config import ConfigError, load_config
from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.api import load_model
from tuneforge.peft.apply import apply_lora
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.bnb4bit import Bnb4bitLinear
from tuneforge.precision.bnb_codes import dequantize
from tuneforge.precision.four_bit_fp8 import fp8_weight, reference_fp8_weight
from tuneforge.precision.fp8 import E4M3, Fp8Recipe, quantize


def _four_bit(quant_type: str, double_quant: bool, recipe: Fp8Recipe) -> Bnb4bitLinear:
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=False)
    four_bit = Bnb4bitLinear(linear, quant_type, double_quant)
    four_bit.compute_in_fp8(recipe)
    return four_bit


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", True), ("fp4", False)])
@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
def test_the_fp8_weights_are_bitsandbytes_values_rounded(quant_type, double_quant, scaling):
    four_bit = _four_bit(quant_type, double_quant, Fp8Recipe.of("e4m3", scaling))
    held, layout = four_bit._held()[:5], four_bit.layout
    multiplier = four_bit.fp8_multiplier
    weight = dequantize(*held, layout, torch.float32)
    amax = weight.abs().amax(dim=1) if scaling == "rowwise" else weight.abs().amax().expand(96)
    torch.testing.assert_close(multiplier, 448.0 / amax, rtol=1e-6, atol=0)
    expected = (weight * multiplier[:, None]).to(E4M3)  # round to nearest, largest onto 448
    for got in (
        reference_fp8_weight(held, layout, multiplier),
        fp8_weight(held, layout, four_bit.code_values, multiplier, transposed=False),
        fp8_weight(held, layout, four_bit.code_values, multiplier, transposed=True).t(),
    ):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("fp8", ["e4m3", "hybrid"])
def test_the_product_and_its_gradients_are_the_fp8_reference(fp8):
    recipe = Fp8Recipe.of(fp8, "rowwise")
    four_bit = _four_bit("nf4", True, recipe)
    x = torch.randn(40, 256, requires_grad=True)
    A = (0.1 * torch.randn(8, 256)).requires_grad_()
    B = (0.1 * torch.randn(96, 8)).requires_grad_()
    y = four_bit.product(x, A, B, 2.0)
    grad = torch.randn_like(y)
    dx, dA, dB = torch.autograd.grad(y, (x, A, B), grad)
    # the reference: every operand rounded as the recipe says, the products in fp32
    scale = four_bit.fp8_multiplier.reciprocal()
    weight = reference_fp8_weight(four_bit._held()[:5], four_bit.layout, four_bit.fp8_multiplier)
    weight = weight.float() * scale[:, None]
    xq, xs = quantize(x.detach(), recipe.forward, rowwise=True)
    u = x.detach() @ A.detach().t()
    expected = (xq.float() * xs) @ weight.t() + 2.0 * u @ B.detach().t()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    gq, gs = quantize(grad * scale, recipe.backward, rowwise=True)  # W's scales folded into g
    gu = grad @ B.detach()
    expected_dx = (gq.float() * gs) @ (weight / scale[:, None]) + 2.0 * gu @ A.detach()
    torch.testing.assert_close(dx, expected_dx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dA, 2.0 * gu.t() @ x.detach())
    torch.testing.assert_close(dB, 2.0 * grad.t() @ u)
    four_bit.fp8 = None  # against the same base multiplied in full precision: E4M3's rounding
    y_full = four_bit.product(x, A, B, 2.0)
    assert ((y - y_full).norm() / y_full.norm()).item() < 0.04


def test_a_4bit_base_takes_fp8_products_and_the_log_says_so():
    demo = REPO / "examples" / "demo.yaml"
    qlora = ["model.quantize=nf4", "lora.enabled=true", "model.dtype=bfloat16"]
    assert load_config(demo, [*qlora, "precision.fp8=e4m3"]).precision.fp8 == "e4m3"
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*qlora, "precision.fp8=e4m3", "precision.fp8_base_weights=true"])
    assert "fp8_base_weights" in issues_of(raised.value)["model.quantize"]
    model = load_model("demo-tiny", dtype="float32", device="cpu", seed=0)
    apply_lora(model, {"target_modules": ["all-linear"], "rank": 4, "alpha": 8})
    section = ModelSection(name="demo-tiny", quantize="nf4")
    report = apply_precision(model, PrecisionSection(fp8="e4m3"), base=section)
    bases = [m for m in model.modules() if isinstance(m, Bnb4bitLinear)]
    assert bases and all(base.fp8 is not None for base in bases)
    assert any("dequantised into FP8 (E4M3 forward" in line for line in report.lines)
