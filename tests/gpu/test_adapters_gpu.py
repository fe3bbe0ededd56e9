"""QLoRA and DoRA on the GPU, bf16: our 4-bit base against transformers + bitsandbytes + `peft`
(logits and one backward's gradients, training mode), our 4-bit products inside compiled blocks
against eager ones, and DoRA against `peft`'s. The 4-bit base multiplied in FP8: the kernel's
E4M3 values against bitsandbytes' own dequantisation rounded, and the products against the
bf16 ones."""

import pytest
import torch
from torch import nn

pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")

from peft import PeftModel
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import tuneforge
from tests.helpers import TARGETS, TOKENS, randomise_adapters, save_tiny_llama
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.api import load_model
from tuneforge.peft.apply import lora_modules
from tuneforge.peft.lora import LoRALinear
from tuneforge.precision.apply import quantize_frozen_base
from tuneforge.precision.bnb4bit import Bnb4bitLinear
from tuneforge.precision.four_bit_fp8 import fp8_weight, reference_fp8_weight
from tuneforge.precision.fp8 import Fp8Recipe


def _ours(directory, adapters: dict, quantized: bool):
    model = load_model(directory, dtype="bfloat16", device="cuda", attention="sdpa")
    tuneforge.apply_lora(model, adapters, dtype=torch.float32)
    if quantized:
        quantize_frozen_base(model, "nf4", True)
    randomise_adapters(model)
    return model


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("adapter", ["qlora", "dora"])
def test_adapters_match_peft_on_the_gpu(tmp_path, adapter):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    settings = {"target_modules": TARGETS, "rank": 4, "alpha": 8, "use_dora": adapter == "dora"}
    model = _ours(tmp_path / "base", settings, quantized=adapter == "qlora")
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    quantization = None
    if adapter == "qlora":
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(
        tmp_path / "base", quantization_config=quantization, dtype=torch.bfloat16,
        device_map={"": 0}, attn_implementation="sdpa",
    )  # fmt: skip
    peft_model = PeftModel.from_pretrained(hf, tmp_path / "adapter", is_trainable=True).train()
    tokens = TOKENS[None].cuda()
    ours, theirs = model(tokens)[0].float(), peft_model(tokens).logits[0].float()
    assert _relative(ours, theirs) < 1e-2  # bf16 products in different orders
    ours.logsumexp(-1).sum().backward()
    theirs.logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    for name, module in lora_modules(model).items():
        stem = "model." + name.replace("attn.", "self_attn.")
        key = next(k for k in grads if k.endswith(f"{stem}.lora_B.default.weight"))
        assert _relative(module.lora_B.grad, grads[key]) < 3e-2


def test_compiled_4bit_blocks_match_eager_ones(tmp_path):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    settings = {"target_modules": TARGETS, "rank": 4, "alpha": 8}
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = _ours(tmp_path / "base", settings, quantized=True)
        wrap_blocks(model, BlockWrapping(compile=compiled))
        logits = model(TOKENS[None].cuda())[0].float()
        losses[compiled] = logits
    assert _relative(losses[True], losses[False]) < 1e-2


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", True), ("fp4", False)])
@pytest.mark.parametrize("shape", [(4096, 1024), (1000, 1536)])
def test_the_fp8_kernel_rounds_bitsandbytes_values_to_e4m3(quant_type, double_quant, shape):
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=False, device="cuda", dtype=torch.bfloat16)
    four_bit = Bnb4bitLinear(linear, quant_type, double_quant)
    four_bit.compute_in_fp8(Fp8Recipe.of("e4m3", "rowwise"))
    held, values, multiplier = four_bit._held()[:5], four_bit.code_values, four_bit.fp8_multiplier
    expected = reference_fp8_weight(held, four_bit.layout, multiplier).view(torch.uint8)
    rows = fp8_weight(held, four_bit.layout, values, multiplier, transposed=False)
    columns = fp8_weight(held, four_bit.layout, values, multiplier, transposed=True)
    assert torch.equal(rows.view(torch.uint8), expected)
    assert columns.is_contiguous() and torch.equal(columns.t().view(torch.uint8), expected)
    assert rows.float().abs().amax(dim=1).eq(448).all()  # each row's absmax onto E4M3's largest


@pytest.mark.parametrize("fp8", ["e4m3", "hybrid"])
@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
def test_the_4bit_base_in_fp8_against_its_bf16_products(fp8, scaling):
    """Eager and compiled, against the same 4-bit base multiplied in bf16 (bitsandbytes' values
    exactly): the difference is E4M3's rounding of the weights, inputs and gradients."""
    torch.manual_seed(0)
    linear = nn.Linear(1024, 768, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = LoRALinear(linear, rank=16, alpha=32, dtype=torch.float32)
    nn.init.normal_(layer.lora_B, std=0.02)
    layer.base = Bnb4bitLinear(linear, "nf4", True)
    x = torch.randn(3000, 1024, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(3000, 768, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name in ("bf16", "fp8", "fp8-compiled"):
        if name == "fp8":
            layer.base.compute_in_fp8(Fp8Recipe.of(fp8, scaling))
        run = torch.compile(layer) if name == "fp8-compiled" else layer
        layer.zero_grad()
        rows = x.clone().requires_grad_()
        y = run(rows)
        y.backward(grad)
        results[name] = (y, rows.grad, layer.lora_A.grad.clone(), layer.lora_B.grad.clone())
    bounds = {"y": 0.05, "dx": 0.05 if fp8 == "e4m3" else 0.09, "dA": 0.01, "dB": 0.05}
    for name, bound in bounds.items():
        index = list(bounds).index(name)
        assert _relative(results["fp8"][index], results["bf16"][index]) < bound, name
        assert _relative(results["fp8-compiled"][index], results["fp8"][index]) < 1e-2, name
