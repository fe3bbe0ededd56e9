"""The frozen linears that compute in FP8 or emulated FP4 under a LoRA adapter: FP8 scaling as
torchao computes it, the products against the dequantised operands' product, the gradients
against the bf16 LoRA path, and the swap on a model (what is kept, saved and refused)."""

import pytest
import torch
from torch import nn

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError
from tuneforge.models.api import load_model
from tuneforge.peft.apply import apply_lora, merge_lora
from tuneforge.peft.lora import LoRALinear
from tuneforge.precision.apply import apply_precision
from tuneforge.precision.fp4 import fake_quantize, quantize_fp4
from tuneforge.precision.fp8 import E4M3, E5M2, Fp8Recipe, dequantize, quantize
from tuneforge.precision.frozen_linear import Fp4Linear, Fp8Linear
from tuneforge.precision.refusals import refuse_unsupported_precision


def _torchao_float8():
    try:
        from torchao.float8.config import ScalingGranularity
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import LinearMMConfig
    except Exception as error:
        pytest.skip(f"torchao's float8 does not import here ({error})")
    return ScalingGranularity, hp_tensor_to_float8_dynamic, LinearMMConfig


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("rowwise", [False, True])
def test_fp8_scaling_is_torchaos_bit_for_bit(dtype, rowwise):
    granularity, to_float8, mm_config = _torchao_float8()
    torch.manual_seed(0)
    values = torch.randn(24, 64, dtype=torch.bfloat16) * torch.logspace(-3, 3, 24).unsqueeze(1)
    values[3] = 0  # an all-zero row
    ours, scale = quantize(values, dtype, rowwise)
    kind = granularity.AXISWISE if rowwise else granularity.TENSORWISE
    theirs = to_float8(
        values, dtype, mm_config(), scaling_granularity=kind, axiswise_dim=-1 if rowwise else None
    )
    assert torch.equal(ours.view(torch.uint8), theirs._data.view(torch.uint8))
    assert torch.equal(scale.reshape(theirs._scale.shape), theirs._scale.reciprocal())


def _layer(base: nn.Module, dtype: torch.dtype) -> LoRALinear:
    layer = LoRALinear(nn.Linear(64, 96, bias=False), rank=8, alpha=16, dtype=torch.float32)
    nn.init.normal_(layer.lora_B, std=0.05)
    layer.base = base
    return layer


def _run(layer: LoRALinear, x: torch.Tensor, grad: torch.Tensor):
    for param in (layer.lora_A, layer.lora_B):
        param.grad = None
    x = x.detach().requires_grad_()
    y = layer(x)
    y.backward(grad)
    return y, x.grad, layer.lora_A.grad, layer.lora_B.grad


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@pytest.mark.parametrize("fnuz", [False, True], ids=["ocp", "mi300-fnuz"])
@pytest.mark.parametrize("fp8", ["e4m3", "hybrid"])
@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
def test_fp8_lora_product_against_its_dequantised_operands_and_the_bf16_path(fp8, scaling, fnuz):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(torch.bfloat16).requires_grad_(False)
    recipe = Fp8Recipe.of(fp8, scaling, fnuz)
    layer = _layer(Fp8Linear(linear, recipe, keep_weight=True), torch.bfloat16)
    reference = _layer(linear, torch.bfloat16)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    grad = torch.randn(40, 96, dtype=torch.bfloat16)
    y, dx, dA, dB = _run(layer, x, grad)
    # the forward is exactly the product of the dequantised operands (fp32 sums, one rounding)
    rowwise = scaling == "rowwise"
    xq, xs = quantize(x, recipe.forward, rowwise)
    wq, ws = quantize(linear.weight, recipe.forward, rowwise)
    assert layer.base.weight_fp8.dtype == recipe.forward
    expected = dequantize(xq, xs, torch.float32) @ dequantize(wq, ws, torch.float32).t()
    update = (x.float() @ layer.lora_A.t().bfloat16().float()).bfloat16().float()
    expected = expected + linear.bias.float() + 2.0 * update @ layer.lora_B.bfloat16().float().t()
    assert _relative(y, expected) < 1e-2
    # against bf16 throughout: FP8's rounding (3 or 2 mantissa bits) averaged over 64 products
    plain = _run(reference, x, grad)
    bounds = {"y": 0.06, "dx": 0.06 if fp8 == "e4m3" else 0.12, "dA": 0.02, "dB": 0.06}
    for (name, bound), got, want in zip(bounds.items(), (y, dx, dA, dB), plain, strict=True):
        assert got.dtype == want.dtype, name
        assert _relative(got, want) < bound, name


def test_fp8_base_weights_only_computes_the_same_and_saves_the_same_adapter():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=False).to(torch.bfloat16).requires_grad_(False)
    kept = _layer(Fp8Linear(linear, Fp8Recipe(), keep_weight=True), torch.bfloat16)
    only = _layer(Fp8Linear(linear, Fp8Recipe(), keep_weight=False), torch.bfloat16)
    only.load_state_dict(kept.state_dict(), strict=False)
    x, grad = torch.randn(16, 64, dtype=torch.bfloat16), torch.randn(16, 96, dtype=torch.bfloat16)
    for got, want in zip(_run(only, x, grad), _run(kept, x, grad), strict=True):
        assert torch.equal(got, want)
    assert set(kept.state_dict()) == {"base.weight", "lora_A", "lora_B"}
    assert set(only.state_dict()) == {"lora_A", "lora_B"}  # quantised buffers are not saved
    assert only.base.weight_fp8.dtype == E4M3 and only.base.weight_fp8.shape == (96, 64)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_fp4_emulation_is_the_recipes_rounding_and_packed_weights_compute_the_same(recipe):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=False).requires_grad_(False)
    packed = _layer(Fp4Linear(linear, recipe, packed=True, keep_weight=False), torch.float32)
    held = _layer(Fp4Linear(linear, recipe, packed=False, keep_weight=True), torch.float32)
    held.load_state_dict(packed.state_dict(), strict=False)
    x, grad = torch.randn(8, 64), torch.randn(8, 96)
    torch.manual_seed(7)  # the output gradient rounds stochastically
    y, dx, dA, dB = _run(packed, x, grad)
    torch.manual_seed(7)
    for got, want in zip((y, dx, dA, dB), _run(held, x, grad), strict=True):
        assert torch.equal(got, want)
    weight = quantize_fp4(linear.weight, recipe, square=True).dequantize()
    A, B = packed.lora_A.detach(), packed.lora_B.detach()
    assert torch.allclose(y, fake_quantize(x, recipe) @ weight.t() + 2.0 * (x @ A.t()) @ B.t())
    gu = grad @ B
    torch.manual_seed(7)
    rounded = fake_quantize(grad, recipe, stochastic=True)
    assert torch.allclose(dx, rounded @ weight + 2.0 * gu @ A, atol=1e-5)
    assert torch.allclose(dA, 2.0 * gu.t() @ x, atol=1e-5)  # the adapters see unrounded values
    # 4 bits cost accuracy: the rounding is visible, and bounded
    assert 0.01 < _relative(y, x @ linear.weight.t() + 2.0 * (x @ A.t()) @ B.t()) < 0.3
    bits = 8 * packed.base.weight_bytes() / linear.weight.numel()
    assert bits == pytest.approx(4.5 if recipe == "nvfp4" else 4.25, abs=0.01)


def _demo_model(targets: list[str]):
    torch.manual_seed(0)
    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    apply_lora(model, {"target_modules": targets, "rank": 4, "alpha": 8}, None, torch.float32)
    return model


@pytest.mark.parametrize(
    "section",
    [
        PrecisionSection(fp8="e4m3"),
        PrecisionSection(fp8="hybrid", fp8_scaling="tensorwise", fp8_base_weights=True),
        PrecisionSection(fp4="e2m1", fp4_param=True),
    ],
    ids=["fp8", "fp8-only", "fp4-packed"],
)
def test_a_model_runs_its_frozen_linears_in_low_precision_and_trains_only_adapters(section):
    model = _demo_model(["q_proj", "v_proj", "down_proj"])
    names = set(model.state_dict())
    report = apply_precision(model, section)
    kind = Fp8Linear if section.fp8 else Fp4Linear
    layers = len(model.layers)
    swapped = [m for m in model.layers.modules() if isinstance(m, kind)]
    assert len(swapped) == 7 * layers  # adapted (q, v, down) and plain frozen ones alike
    assert f"q_proj ×{layers}" in report.lines[0] and f"o_proj ×{layers}" in report.lines[0]
    assert any("expert" not in line and "output layer" in line for line in report.lines)
    dropped = {name for name in names if name.endswith("proj.weight") or "base.weight" in name}
    expected = names if not (section.fp8_base_weights or section.fp4_param) else names - dropped
    assert set(model.state_dict()) == expected
    tokens = torch.randint(0, 100, (1, 32))
    logits = model(tokens)
    logits.float().square().mean().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in name for name in trained)
    with pytest.raises(TypeError, match="low-precision"):
        merge_lora(model)


def test_fp8_is_refused_without_fp8_tensor_cores_and_fp4_emulation_is_not():
    with pytest.raises(TuneforgeError, match="FP8 tensor cores"):
        refuse_unsupported_precision(PrecisionSection(fp8="e4m3"), torch.device("cpu"))
    refuse_unsupported_precision(PrecisionSection(fp4="e2m1"), torch.device("cpu"))


def test_q_k_and_v_stacked_in_fp8_compute_what_they_compute_apart():
    model = _demo_model(["all-linear"])
    attention = model.layers[0].attn
    linears = [attention.q_proj, attention.k_proj, attention.v_proj]
    for index, linear in enumerate(linears):  # non-zero B, and unequal scalings
        nn.init.normal_(linear.lora_B, std=0.05, generator=torch.Generator().manual_seed(index))
    attention.k_proj.scaling = 0.5
    report = apply_precision(model, PrecisionSection(fp8="e4m3"))
    assert any(line.startswith("q, k and v of 4 block(s)") for line in report.lines)
    stack = attention.q_proj.base.stack
    x = torch.randn(40, model.args.dim, dtype=torch.bfloat16)
    grads = [torch.randn(40, linear.base.out_features, dtype=torch.bfloat16) for linear in linears]

    def run():
        for linear in linears:
            linear.lora_A.grad = linear.lora_B.grad = None
        rows = x.clone().requires_grad_()
        outputs = LoRALinear.project_together(rows, linears)
        torch.autograd.backward(outputs, grads)
        adapters = [p.grad.clone() for linear in linears for p in (linear.lora_A, linear.lora_B)]
        return [*outputs, rows.grad, *adapters]

    together = run()
    attention.q_proj.base.stack = None
    apart = run()
    attention.q_proj.base.stack = stack
    # the input gradient's FP8 operand is quantised once per token across q, k and v, not per
    # linear: FP8's rounding apart; the outputs and the adapters' gradients agree closely
    bounds = [5e-3] * 3 + [0.05] + [5e-3] * 6
    for got, want, bound in zip(together, apart, bounds, strict=True):
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < bound


def test_fp4_param_gather_makes_the_codes_and_scales_what_fsdp2_shards():
    """With fp4_param_gather under FSDP2 the packed base is frozen byte parameters: each of two
    ranks holds half of its rows (a fake process group: sharding, not the exchange, which
    tests/integration/test_distributed.py runs)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    model = _demo_model(["q_proj"])
    section = PrecisionSection(fp4="e2m1", fp4_param=True, fp4_param_gather=True)
    report = apply_precision(model, section, sharded=True)
    assert "all-gathered as FP4" in report.lines[-1]
    base = model.layers[0].attn.q_proj.base
    codes, scales = base.weight_codes, base.weight_scales
    assert isinstance(codes, nn.Parameter) and not codes.requires_grad
    assert codes.dtype == scales.dtype == torch.uint8
    assert "layers.0.attn.q_proj.lora_A" in dict(model.named_parameters())
    dist.init_process_group(backend="fake", rank=0, world_size=2, store=FakeStore())
    try:
        fully_shard(model.layers[0])
        for held in (base.weight_codes, base.weight_scales):
            assert held.to_local().shape[0] * 2 == held.shape[0]
    finally:
        dist.destroy_process_group()
    unsharded = apply_precision(_demo_model(["q_proj"]), section)  # one process: buffers
    assert not any("FSDP2" in line for line in unsharded.lines)


def test_torchaos_fp8_weights_become_fp32_shards_as_every_other_trained_weight():
    """fp32 master shards under FSDP2 for a full fine-tune through torchao's float8 training:
    its weights are a tensor subclass, and all of a block's sharded parameters must be fp32 (FSDP2
    refuses mixed dtypes at the first forward), inner tensors included."""
    pytest.importorskip("torchao.float8")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tuneforge.config.sections.parallel import ParallelSection
    from tuneforge.parallel.distributed import Dist, parallelize
    from tuneforge.parallel_dims import ParallelDims
    from tuneforge.precision.fp8 import Fp8Recipe
    from tuneforge.precision.torchao_training import torchao_config, torchao_linear

    model = load_model("demo-tiny", dtype="bfloat16", device=torch.device("cpu"), seed=0)
    config = torchao_config(Fp8Recipe.of("e4m3", "tensorwise"), sharded=True)
    attention = model.layers[0].attn
    attention.q_proj = torchao_linear(attention.q_proj, config)
    dist.init_process_group(backend="fake", rank=0, world_size=2, store=FakeStore())
    try:
        fsdp = ParallelDims.of("fsdp", 2)
        parallelize(model, model.layers, fsdp, ParallelSection(), Dist(0, 2), fp32_shards=True)
        for name, param in model.named_parameters():
            local = param.to_local()
            assert param.dtype == local.dtype == torch.float32, name
            assert getattr(local, "_tensor", local).dtype == torch.float32, name
        assert type(attention.q_proj.weight.to_local()).__name__ != "Tensor"  # still torchao's
    finally:
        dist.destroy_process_group()
