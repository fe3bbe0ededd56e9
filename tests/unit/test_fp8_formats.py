"""MI300 (gfx942) takes FP8 in its FNUZ formats only: which GPUs get them, and a model put in
FP8 for one holds and multiplies FNUZ values throughout (the products themselves are checked
against their dequantised operands in test_low_precision_linears and test_fp8_expert_banks)."""

from types import SimpleNamespace

import pytest
import torch

import tuneforge.precision.apply as apply_module
from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError
from tuneforge.models.api import load_model
from tuneforge.peft.apply import apply_lora
from tuneforge.precision.fp8 import E4M3, E4M3_FNUZ, E5M2_FNUZ, Fp8Recipe, fnuz_formats
from tuneforge.precision.fp8_training import Fp8TrainingLinear
from tuneforge.precision.frozen_linear import Fp8Linear
from tuneforge.precision.refusals import refuse_unsupported_precision


@pytest.mark.parametrize(
    ("hip", "arch", "expected"),
    [
        ("6.4", "gfx942:sramecc+:xnack-", True),  # MI300X
        ("6.4", "gfx950", False),  # MI355X: OCP formats
        (None, "", False),  # NVIDIA
    ],
)
def test_only_mi300_takes_the_fnuz_formats(monkeypatch, hip, arch, expected):
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(gcnArchName=arch)
    )
    assert fnuz_formats(torch.device("cuda", 0)) is expected
    assert fnuz_formats(torch.device("cpu")) is False


def test_the_recipe_names_the_fnuz_formats():
    recipe = Fp8Recipe.of("hybrid", "rowwise", fnuz=True)
    assert (recipe.forward, recipe.backward) == (E4M3_FNUZ, E5M2_FNUZ)
    assert recipe.describe() == "E4M3 FNUZ forward, E5M2 FNUZ gradients, rowwise"
    assert Fp8Recipe.of("e4m3", "rowwise").forward == E4M3


def test_a_model_on_mi300_holds_and_multiplies_fnuz_values(monkeypatch):
    monkeypatch.setattr(apply_module, "fnuz_formats", lambda device: True)
    lora = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    apply_lora(lora, {"target_modules": ["q_proj"], "rank": 4, "alpha": 8}, None, torch.float32)
    report = apply_precision_lines(lora, PrecisionSection(fp8="e4m3"))
    bases = [m for m in lora.modules() if isinstance(m, Fp8Linear)]
    assert bases and all(m.weight_fp8.dtype == E4M3_FNUZ for m in bases)
    assert "E4M3 FNUZ forward" in report
    lora(torch.randint(0, 100, (1, 32))).float().square().mean().backward()

    full = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    apply_precision_lines(full, PrecisionSection(fp8="hybrid"))
    trained = [m for m in full.modules() if isinstance(m, Fp8TrainingLinear)]
    assert trained and all(m.recipe.backward == E5M2_FNUZ for m in trained)
    full(torch.randint(0, 100, (1, 32))).float().square().mean().backward()
    assert all(m.weight.grad is not None for m in trained)


def test_a_4bit_base_in_fp8_on_mi300_is_refused_clearly(monkeypatch):
    """At the start of training (before the run directory is touched), and by the swap."""
    mi300 = SimpleNamespace(major=9, minor=4, name="AMD Instinct MI300X", gcnArchName="gfx942")
    monkeypatch.setattr(torch.version, "hip", "6.4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: mi300)
    fp8, gpu = PrecisionSection(fp8="e4m3"), torch.device("cuda", 0)
    base = ModelSection(name="demo-tiny", quantize="nf4")
    refuse_unsupported_precision(fp8, gpu, ModelSection(name="demo-tiny"))
    with pytest.raises(TuneforgeError, match="MI300: FNUZ formats"):
        refuse_unsupported_precision(fp8, gpu, base)
    monkeypatch.setattr(apply_module, "fnuz_formats", lambda device: True)
    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    with pytest.raises(TuneforgeError, match=r"drop precision\.fp8"):
        apply_module.apply_precision(model, fp8, base=base)


def apply_precision_lines(model, section: PrecisionSection) -> str:
    return "\n".join(apply_module.apply_precision(model, section).lines)
