"""The low-precision linears on the GPU: the FP8 product through torch._scaled_mm against the
dequantised operands and the bf16 path, eager and compiled; base weights held only in FP8; and
short LoRA runs in FP8 and emulated FP4 against the same run in bf16; frozen expert banks through
the grouped FP8 kernel against the per-expert product."""

import pytest
import torch
from torch import nn

from tests.helpers import packed_training_losses
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.api import load_model
from tuneforge.models.moe import expert_offsets, grouped_linear
from tuneforge.peft.apply import apply_lora
from tuneforge.peft.lora import LoRALinear
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.fp8 import E4M3, Fp8Recipe, dequantize, quantize
from tuneforge.precision.fp8_experts import Fp8ExpertWeights, grouped_fp8_here
from tuneforge.precision.frozen_linear import Fp8Linear
from tuneforge.train.objectives.sft import NextTokenObjective

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("FP8 needs a GPU with FP8 tensor cores", allow_module_level=True)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("fp8", ["e4m3", "hybrid"])
@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
@pytest.mark.parametrize("compiled", [False, True])
def test_fp8_product_against_the_dequantised_operands_and_bf16(fp8, scaling, compiled):
    torch.manual_seed(0)
    linear = nn.Linear(1024, 768, bias=False, device="cuda", dtype=torch.bfloat16)
    linear.requires_grad_(False)
    layers = {}
    for name, base in (
        ("fp8", Fp8Linear(linear, Fp8Recipe.of(fp8, scaling), True)),
        ("bf16", linear),
    ):
        layer = LoRALinear(linear, rank=16, alpha=32, dtype=torch.float32)
        torch.manual_seed(1)
        layer.reset_lora_parameters()
        nn.init.normal_(layer.lora_B, std=0.02)
        layer.base = base
        layers[name] = layer
    x = torch.randn(3000, 1024, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(3000, 768, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name, layer in layers.items():
        run = torch.compile(layer) if compiled and name == "fp8" else layer
        rows = x.clone().requires_grad_()
        y = run(rows)
        y.backward(grad)
        results[name] = (y, rows.grad, layer.lora_A.grad, layer.lora_B.grad)
    y = results["fp8"][0]
    rowwise = scaling == "rowwise"
    xq, xs = quantize(x, E4M3, rowwise)
    wq, ws = quantize(linear.weight, E4M3, rowwise)
    base = dequantize(xq, xs, torch.float32) @ dequantize(wq, ws, torch.float32).t()
    A, B = layers["fp8"].lora_A.bfloat16(), layers["fp8"].lora_B.bfloat16()
    expected = base + 2.0 * ((x @ A.t()) @ B.t()).float()
    assert _relative(y, expected) < 5e-3
    bounds = {"y": 0.04, "dx": 0.04 if fp8 == "e4m3" else 0.08, "dA": 0.01, "dB": 0.04}
    for (name, bound), got, want in zip(bounds.items(), *results.values(), strict=True):
        assert _relative(got, want) < bound, name


def test_fp8_base_weights_only_free_the_bf16_weights():
    def allocated_after(keep: bool) -> int:
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated()
        model = load_model("llama-3.2-1b", num_layers=2, dtype="bfloat16", device="cuda", seed=0)
        apply_lora(model, {"target_modules": ["all-linear"], "rank": 16, "alpha": 32})
        apply_precision(model, PrecisionSection(fp8="e4m3", fp8_base_weights=not keep))
        used = torch.cuda.memory_allocated() - start
        del model
        return used

    linears = 2 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048)  # q, o; k, v; MLP
    kept, only = allocated_after(True), allocated_after(False)
    assert kept - only == pytest.approx(2 * linears, rel=0.02)  # the bf16 weights, 2 bytes each


def losses(
    precision: PrecisionSection, compiled: bool, steps: int = 40, shape: str = "llama-3.2-1b"
) -> list[float]:
    torch.manual_seed(0)
    model = load_model(shape, num_layers=2, dtype="bfloat16", device="cuda", seed=0)
    lora = {"target_modules": ["all-linear"], "rank": 16, "alpha": 32}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.float32)
    apply_precision(model, precision)
    if compiled:
        wrap_blocks(model, BlockWrapping(compile=True))
    objective = NextTokenObjective(model, compiled_loss=compiled)
    params = [p for p in model.parameters() if p.requires_grad]
    return packed_training_losses(objective, params, 2e-3, steps)


@pytest.mark.parametrize(
    ("precision", "tolerance"),
    [
        (PrecisionSection(fp8="e4m3"), 0.02),
        (PrecisionSection(fp8="hybrid", fp8_scaling="tensorwise", fp8_base_weights=True), 0.02),
        (PrecisionSection(fp4="e2m1", fp4_param=True), 0.05),
    ],
    ids=["fp8", "fp8-hybrid-tensorwise", "fp4"],
)
def test_a_short_low_precision_run_follows_bf16(precision, tolerance):
    reference = losses(PrecisionSection(), compiled=True)
    low = losses(precision, compiled=True)
    assert reference[-1] < reference[0] - 1.0  # it learns
    assert low[-1] < low[0] - 1.0
    drop = reference[0] - reference[-1]
    assert abs(low[-1] - reference[-1]) < tolerance * drop + 0.02


@pytest.mark.skipif(
    not grouped_fp8_here(torch.device("cuda")), reason="no grouped FP8 kernel on this GPU"
)
@pytest.mark.parametrize("compiled", [False, True])
def test_grouped_fp8_expert_product_is_the_per_expert_product(compiled):
    torch.manual_seed(0)
    counts = torch.tensor([300, 0, 17, 1, 640, 95, 0, 211])  # uneven, some experts idle
    ids = torch.repeat_interleave(torch.arange(len(counts)), counts).cuda()
    offsets = expert_offsets(ids, len(counts))
    weight = torch.randn(len(counts), 768, 1024, device="cuda", dtype=torch.bfloat16) * 0.02
    bank = Fp8ExpertWeights(weight, rowwise=True)
    rows = torch.randn(ids.numel(), 1024, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(ids.numel(), 768, device="cuda", dtype=torch.bfloat16)
    grouped = torch.compile(bank.grouped) if compiled else bank.grouped
    x = rows.clone().requires_grad_()
    y = grouped(x, offsets)
    y.backward(grad)
    # the CPU path: the same operands through one torch._scaled_mm per expert
    cpu_bank = Fp8ExpertWeights(weight.cpu(), rowwise=True)
    x_cpu = rows.cpu().requires_grad_()
    y_cpu = cpu_bank.grouped(x_cpu, offsets.cpu())
    y_cpu.backward(grad.cpu())
    assert _relative(y.cpu(), y_cpu) < 5e-3 and _relative(x.grad.cpu(), x_cpu.grad) < 5e-3
    plain = rows.clone().requires_grad_()
    reference = grouped_linear(plain, weight, offsets)
    reference.backward(grad)
    assert _relative(y, reference) < 0.05 and _relative(x.grad, plain.grad) < 0.05


@pytest.mark.skipif(
    not grouped_fp8_here(torch.device("cuda")), reason="no grouped FP8 kernel on this GPU"
)
def test_a_short_moe_lora_run_with_fp8_expert_banks_follows_bf16():
    """Both learn, and FP8's loss stays within a share of bf16's descent: a short random-weight
    run wanders more than a dense one (the grouped product itself is held to the per-expert
    one above), so the bound is loose, but a broken FP8 path (no learning, divergence) fails."""
    shape = "qwen3-30b-a3b"
    reference = losses(PrecisionSection(), compiled=True, steps=30, shape=shape)
    low = losses(PrecisionSection(fp8="e4m3", fp8_base_weights=True), True, 30, shape)
    assert reference[-1] < reference[0] - 1.0 and low[-1] < low[0] - 1.0
    assert abs(low[-1] - reference[-1]) < 0.15 * (reference[0] - reference[-1])


def full_losses(precision: PrecisionSection, steps: int = 30) -> list[float]:
    torch.manual_seed(0)
    model = load_model("llama-3.2-1b", num_layers=2, dtype="bfloat16", device="cuda", seed=0)
    apply_precision(model, precision)
    wrap_blocks(model, BlockWrapping(compile=True))
    objective = NextTokenObjective(model, compiled_loss=True)
    return packed_training_losses(objective, list(model.parameters()), 3e-4, steps)


@pytest.mark.parametrize(
    ("fp8", "scaling", "implementation"),
    [
        ("e4m3", "rowwise", "tuneforge"),
        ("hybrid", "rowwise", "tuneforge"),
        ("e4m3", "rowwise", "torchao"),
        ("hybrid", "tensorwise", "torchao"),
    ],
)
def test_a_short_full_fine_tune_in_fp8_follows_bf16(fp8, scaling, implementation):
    if implementation == "torchao":
        pytest.importorskip("torchao.float8", reason="the torchao implementation needs torchao")
    section = PrecisionSection(fp8=fp8, fp8_scaling=scaling, fp8_implementation=implementation)
    reference, low = full_losses(PrecisionSection()), full_losses(section)
    assert reference[-1] < reference[0] - 1.0 and low[-1] < low[0] - 1.0
    assert abs(low[-1] - reference[-1]) < 0.03 * (reference[0] - reference[-1]) + 0.02
