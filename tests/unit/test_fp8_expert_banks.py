"""Frozen expert banks in FP8: the grouped product (one `torch._scaled_mm` per expert off CUDA)
against the product of its dequantised operands and against bf16, the input gradient with the
weight's scales folded into the output gradient, and the swap on a MoE model."""

import pytest
import torch

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.args import ModelArgs
from tuneforge.models.catalog import MoEArgs
from tuneforge.models.decoder import Decoder
from tuneforge.models.moe import ExpertBank, expert_offsets, grouped_linear
from tuneforge.peft.apply import apply_lora, merge_lora
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.fp8 import E4M3, E4M3_FNUZ, dequantize, quantize
from tuneforge.precision.fp8_experts import Fp8ExpertWeights

EXPERTS, OUT, IN = 4, 48, 64


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


def _rows_and_offsets():
    torch.manual_seed(0)
    ids = torch.tensor([0] * 7 + [2] * 20 + [3] * 5)  # expert 1 has no rows
    rows = (
        torch.randn(ids.numel(), IN, dtype=torch.bfloat16)
        * torch.logspace(-1, 1, ids.numel())[:, None]
    )
    return rows.bfloat16(), expert_offsets(ids, EXPERTS), ids


@pytest.mark.parametrize("dtype", [E4M3, E4M3_FNUZ], ids=["ocp", "mi300-fnuz"])
@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_grouped_fp8_product_against_its_dequantised_operands_and_bf16(rowwise, dtype):
    rows, offsets, ids = _rows_and_offsets()
    weight = (torch.randn(EXPERTS, OUT, IN) * torch.logspace(-2, 0, OUT)[:, None]).bfloat16()
    bank = Fp8ExpertWeights(weight, rowwise, dtype)
    assert bank.weight_fp8.dtype == dtype
    x = rows.clone().requires_grad_()
    y = bank.grouped(x, offsets)
    grad = torch.randn_like(y)
    y.backward(grad)
    # the forward: each row's quantised values times its expert's quantised weight, fp32 sums
    xq, xs = quantize(rows, dtype, rowwise)
    wq, ws = quantize(weight, dtype, rowwise)
    x_deq, w_deq = dequantize(xq, xs, torch.float32), dequantize(wq, ws, torch.float32)
    expected = torch.stack([x_deq[i] @ w_deq[ids[i]].t() for i in range(len(ids))])
    assert torch.allclose(y.float(), expected, rtol=1e-2, atol=1e-3)
    # the input gradient: (g·s_W[e]) quantised per row (or per tensor), times W_q[e]
    scale = ws.reshape(EXPERTS, -1).expand(EXPERTS, OUT) if rowwise else ws.expand(EXPERTS, OUT)
    folded = grad.float() * scale[ids]
    gq, gs = quantize(folded, dtype, rowwise)
    g_deq = dequantize(gq, gs, torch.float32)
    wq_values = wq.float()
    expected_dx = torch.stack([g_deq[i] @ wq_values[ids[i]] for i in range(len(ids))])
    assert torch.allclose(x.grad.float(), expected_dx, rtol=1e-2, atol=1e-3)
    # against bf16 throughout: FP8's rounding, not a wrong product
    plain = rows.clone().requires_grad_()
    reference = grouped_linear(plain, weight, offsets)
    reference.backward(grad)
    assert _relative(y, reference) < 0.05
    assert _relative(x.grad, plain.grad) < 0.05
    # one expert's rows alone (the `loop` implementation) make the same product where each row
    # has its own scale (a tensorwise scale is their amax's: it differs)
    if rowwise:
        assert torch.equal(bank.single(rows[7:27], 2), y[7:27].detach())


MOE = ModelArgs(
    vocab_size=64, dim=128, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=256,
    moe=MoEArgs(4, 2, 96), family="qwen3_moe",
)  # fmt: skip


def _moe_model(implementation: str = "grouped") -> Decoder:
    torch.manual_seed(0)
    model = Decoder(MOE, "sdpa").to(torch.bfloat16)
    for bank in model.modules():
        if isinstance(bank, ExpertBank):
            bank.implementation = implementation
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.05)
    apply_lora(model, {"target_modules": ["q_proj", "experts.down_proj"], "rank": 4, "alpha": 8})
    for param in model.parameters():
        if param.requires_grad:
            torch.nn.init.normal_(param, std=0.05)
    return model


@pytest.mark.parametrize("implementation", ["grouped", "loop"])
def test_a_moe_model_runs_its_frozen_banks_in_fp8_and_trains_the_same_adapters(implementation):
    tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    reference = _moe_model(implementation)
    model = _moe_model(implementation)
    names = set(model.state_dict())
    report = apply_precision(model, PrecisionSection(fp8="e4m3", fp8_base_weights=True))
    assert any(line.startswith("expert banks: 4 projection(s) in FP8") for line in report.lines)
    assert not any("expert banks (" in line for line in report.lines)  # none stays bf16
    banks = [module for module in model.modules() if isinstance(module, ExpertBank)]
    assert all(set(bank.low_precision) == {"gate_up_proj", "down_proj"} for bank in banks)
    # the bf16 bank weights are dropped and never saved; the adapters are what they were
    banks_weights = {name for name in names if name.endswith(("gate_up_proj", "experts.down_proj"))}
    frozen = {name for name in names if name.endswith(("proj.weight", "proj.base.weight"))}
    assert len(banks_weights) == 4 and set(model.state_dict()) == names - banks_weights - frozen
    outputs = []
    for candidate in (reference, model):
        logits = candidate(tokens)
        logits.float().square().mean().backward()
        grads = {n: p.grad for n, p in candidate.named_parameters() if p.grad is not None}
        outputs.append((logits, grads))
    (want, want_grads), (got, got_grads) = outputs
    assert set(got_grads) == set(want_grads) and all("lora_" in name for name in got_grads)
    assert _relative(got, want) < 0.03
    for name, grad in want_grads.items():
        assert _relative(got_grads[name], grad) < 0.1, name
    with pytest.raises(TypeError, match="low-precision"):
        merge_lora(model)


def test_trained_banks_stay_in_the_models_dtype_and_the_log_says_so():
    model = _moe_model()
    for param in model.parameters():
        param.requires_grad_(True)  # full fine-tuning
    report = apply_precision(model, PrecisionSection(fp8="e4m3"))
    assert not any(bank.low_precision for bank in model.modules() if isinstance(bank, ExpertBank))
    assert "expert banks (4 trained projection(s))" in report.lines[-1]
    fp4 = apply_precision(_moe_model(), PrecisionSection(fp4="e2m1"))
    assert "expert banks (2: no emulated FP4 expert product)" in fp4.lines[-1]
