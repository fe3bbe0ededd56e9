"""A model with its adapters disabled is the base as loaded: dense (the fused and stacked q, k,
v paths included), MoE with expert-bank adapters, and under an FP8 base; enabled again, the
adapters count as before."""

from dataclasses import replace

import pytest
import torch

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.args import ModelArgs
from tuneforge.models.catalog import MoEArgs
from tuneforge.models.decoder import Decoder
from tuneforge.peft.apply import adapters_disabled, apply_lora
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.precision.apply import apply_precision

DENSE = ModelArgs(vocab_size=64, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=96)
MOE = replace(DENSE, moe=MoEArgs(4, 2, 32), family="qwen3_moe")


def _model(args: ModelArgs) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(args, "sdpa").to(torch.bfloat16)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.05)
    return model


@pytest.mark.parametrize(
    ("args", "precision"),
    [(DENSE, None), (MOE, None), (DENSE, PrecisionSection(fp8="e4m3"))],
    ids=["dense", "moe", "fp8-base"],
)
def test_disabled_adapters_leave_the_base_as_loaded(args, precision):
    tokens = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1))
    base = _model(args)
    adapted = _model(args)
    targets = ["all-linear", *(["experts.gate_up_proj", "experts.down_proj"] if args.moe else [])]
    apply_lora(adapted, {"target_modules": targets, "rank": 4, "alpha": 8})
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    if precision is not None:
        apply_precision(base, precision)
        apply_precision(adapted, precision)
    stack_frozen_weights(adapted)
    with torch.no_grad():
        expected, with_adapters = base(tokens), adapted(tokens)
        with adapters_disabled(adapted):
            without = adapted(tokens)
        again = adapted(tokens)
    assert torch.equal(without, expected)
    assert not torch.allclose(with_adapters, expected, atol=1e-2)
    assert torch.equal(again, with_adapters)
