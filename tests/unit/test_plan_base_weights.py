"""The planner's count of the frozen base linears a precision setting swaps, against the modules
`apply_precision` builds on the same shape: weights, scales and bytes."""

from dataclasses import replace

import pytest
import torch

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.args import ModelArgs
from tuneforge.models.catalog import MoEArgs
from tuneforge.models.decoder import Decoder
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.apply import apply_lora
from tuneforge.peft.lora import LowPrecisionBase
from tuneforge.plan.base_weights import BaseWeights, frozen_linears
from tuneforge.plan.memory import Setup, static_bytes
from tuneforge.precision.apply import apply_precision

DENSE = ModelArgs(vocab_size=64, dim=256, num_layers=2, num_heads=8, num_kv_heads=2, ffn_dim=704)
MOE = replace(DENSE, moe=MoEArgs(4, 2, 96), family="qwen3_moe")
SECTIONS = {
    "fp8": PrecisionSection(fp8="e4m3"),
    "fp8-only": PrecisionSection(fp8="e4m3", fp8_base_weights=True),
    "fp8-tensorwise": PrecisionSection(fp8="hybrid", fp8_scaling="tensorwise"),
    "fp4": PrecisionSection(fp4="e2m1"),
    "nvfp4": PrecisionSection(fp4="e2m1", fp4_param=True),
    "mxfp4": PrecisionSection(fp4="e2m1", fp4_param=True, fp4_recipe="mxfp4"),
}


@pytest.mark.parametrize("args", [DENSE, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("name", list(SECTIONS))
def test_the_planned_base_weights_are_what_the_swap_holds(args, name):
    section = SECTIONS[name]
    model = Decoder(args, "sdpa").to(torch.bfloat16)
    linears = [m for n, m in model.layers.named_modules() if n.endswith("_proj")]
    weights = sum(linear.weight.numel() for linear in linears)
    apply_lora(model, {"target_modules": ["q_proj", "o_proj"], "rank": 4, "alpha": 8})
    report = apply_precision(model, section)
    planned = BaseWeights.of(section)
    assert frozen_linears(args)[0] == weights
    # every tensor the swapped bases hold but their biases: quantised values, scales, and the
    # model's own values where they are kept (stacked q, k, v: views of one tensor, counted once)
    # (and in FP8 the frozen expert banks: their FP8 copies, and the bank's weights if kept)
    held: dict[int, int] = {}
    for base in model.modules():
        tensors = []
        if isinstance(base, LowPrecisionBase):
            tensors = [*base.buffers(recurse=False), getattr(base, "weight", None)]
        elif isinstance(base, ExpertBank) and base.low_precision:
            tensors = [*base.low_precision.buffers(), *base.parameters(recurse=False)]
        for tensor in tensors:
            if tensor is not None:
                storage = tensor.untyped_storage()
                held[storage.data_ptr()] = storage.nbytes()
    assert sum(planned.bytes(args, 2)) == sum(held.values())
    assert report.weight_bytes <= sum(held.values())
    if args.moe is not None:  # the router stays as it was; FP8 holds the banks in FP8
        assert all(type(layer.mlp.router) is torch.nn.Linear for layer in model.layers)
        banks = [module for module in model.modules() if isinstance(module, ExpertBank)]
        assert all(bool(bank.low_precision) == bool(section.fp8) for bank in banks)


def test_the_plans_weights_shrink_by_the_swapped_bytes():
    from tuneforge.models.cost import LoraShape

    setups = {
        name: Setup(DENSE, 2, 4096, LoraShape(16), base_weights=BaseWeights.of(section))
        for name, section in {"bf16": PrecisionSection(), **SECTIONS}.items()
    }
    bf16 = static_bytes(setups["bf16"])[0]
    weights, rows, tensors = frozen_linears(DENSE)
    assert static_bytes(setups["fp8"])[0] - bf16 == weights + 4 * rows  # FP8 values and scales
    assert bf16 - static_bytes(setups["fp8-only"])[0] == weights - 4 * rows
    # 4 bits and an E4M3 scale per 16 elements: 4.5 bits instead of 16
    assert bf16 - static_bytes(setups["nvfp4"])[0] == weights * (2 - 0.5625) - 4 * tensors
    assert static_bytes(setups["fp4"])[0] == bf16  # dequantised values: as many bytes


@pytest.mark.parametrize(("double_quant", "fp8"), [(True, False), (False, False), (True, True)])
def test_the_planned_4bit_base_is_what_bitsandbytes_holds(double_quant, fp8):
    pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")
    from tuneforge.config.sections.model import ModelSection
    from tuneforge.plan.base_weights import dequantised_buffer
    from tuneforge.precision.bnb4bit import Bnb4bitLinear

    model = Decoder(DENSE, "sdpa").to(torch.bfloat16)
    apply_lora(model, {"target_modules": ["q_proj", "o_proj"], "rank": 4, "alpha": 8})
    quantize = ModelSection(name="demo-tiny", quantize="nf4", double_quant=double_quant)
    section = PrecisionSection(fp8="e4m3" if fp8 else None)
    apply_precision(model, section, base=quantize)
    held = 0
    for base in model.modules():
        if isinstance(base, Bnb4bitLinear):  # codes, absmaxes (and the nested ones' absmaxes)
            held += base.weight_codes.numel() + base.weight_absmax.nbytes
            if base.nested_absmax is not None:
                held += base.nested_absmax.nbytes
            if fp8:  # FP8's scales and the code table
                held += base.fp8_multiplier.nbytes + base.fp8_scale.nbytes
                held += base.code_values.nbytes
    assert held > 0
    values, scales = BaseWeights.of(section, quantize).bytes(DENSE, 2)
    buffer = dequantised_buffer(DENSE, 1 if fp8 else 2)  # one E4M3 byte or two bf16 a weight
    assert values + scales - buffer == pytest.approx(held, rel=0.01)
    assert buffer == DENSE.dim * DENSE.ffn_dim * (1 if fp8 else 2)  # gate/up/down
