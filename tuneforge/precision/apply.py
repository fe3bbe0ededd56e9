"""Put a run's precision on its model: the decoder's projections (attention and MLP) swapped for
FP8 or FP4 ones — frozen ones, under an adapter or not, and in FP8 trained ones too — everything
else left as it is; and say what runs in which precision, or refuse a precision the machine
cannot run."""

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import GIB, low_precision_cores
from tuneforge.models.cost import PROJECTION_NAMES
from tuneforge.models.decoder import Decoder
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.lora import LoRALinear, LowPrecisionBase
from tuneforge.peft.targets import BANK_PROJECTIONS
from tuneforge.precision.bnb4bit import FOUR_BIT, Bnb4bitLinear
from tuneforge.precision.bnb_codes import BLOCK as BNB_BLOCK
from tuneforge.precision.fp4 import BLOCK_SIZE
from tuneforge.precision.fp8 import FORMAT_NAMES, Fp8Recipe, fits_scaled_mm, fnuz_formats
from tuneforge.precision.fp8_experts import Fp8ExpertWeights, grouped_fp8_here
from tuneforge.precision.fp8_training import Fp8TrainingLinear
from tuneforge.precision.frozen_linear import Fp4Linear, Fp8Linear
from tuneforge.precision.stacked_fp8 import stack_fp8_groups
from tuneforge.precision.torchao_training import (
    gathers_in_fp8,
    require_torchao,
    torchao_config,
    torchao_linear,
)


@dataclass
class PrecisionReport:
    """What `apply_precision` did, for the log: one line per kind of module."""

    lines: list[str] = field(default_factory=list)
    weight_bytes: int = 0
    """Bytes of the low-precision weights and their scales."""

    def log(self, logger: logging.Logger) -> None:
        for line in self.lines:
            logger.info("precision: %s", line)


def refuse_unsupported_precision(
    section: PrecisionSection, device: torch.device, base: ModelSection | None = None
) -> None:
    """FP8 needs FP8 tensor cores; FP4 runs emulated anywhere."""
    if not section.fp8:
        return
    if device.type != "cuda":
        raise TuneforgeError(
            "precision.fp8 needs a GPU with FP8 tensor cores (NVIDIA from Ada/Hopper, AMD MI300 "
            f"and later); this process runs on {device.type}: drop precision.fp8 here"
        )
    properties = torch.cuda.get_device_properties(device)
    capability = (properties.major, properties.minor)
    arch = getattr(properties, "gcnArchName", "") or ""
    if not low_precision_cores(capability, arch)["fp8"]:
        raise TuneforgeError(
            f"precision.fp8 needs FP8 tensor cores, which the {properties.name} lacks "
            "(NVIDIA from compute capability 8.9, AMD from gfx942): drop precision.fp8, or "
            "run where `tuneforge doctor env` lists FP8"
        )
    _refuse_4bit_fp8_in_fnuz(section, base, fnuz_formats(device))


def _refuse_4bit_fp8_in_fnuz(
    section: PrecisionSection, base: ModelSection | None, fnuz: bool
) -> None:
    if section.fp8 and fnuz and base is not None and base.quantize:
        raise TuneforgeError(
            "precision.fp8 with model.quantize dequantises the 4-bit base into OCP E4M3, which "
            "this GPU's FP8 tensor cores (MI300: FNUZ formats) do not take: drop precision.fp8 "
            "(the 4-bit products then run in the model's dtype)"
        )


def apply_precision(
    model: Decoder,
    section: PrecisionSection,
    sharded: bool = False,
    base: ModelSection | None = None,
) -> PrecisionReport:
    """Swap the decoder blocks' projections for low-precision ones as `section` says: frozen
    ones (a LoRA base) for FP8 or FP4 ones, trained ones (full fine-tuning) for FP8 ones; or,
    with `base.quantize`, the frozen ones for bitsandbytes' 4-bit ones (QLoRA).
    `sharded`: the model is about to be sharded by FSDP2."""
    fnuz = fnuz_formats(next(model.parameters()).device)
    recipe = Fp8Recipe.of(section.fp8, section.fp8_scaling, fnuz) if section.fp8 else None
    if base is not None and base.quantize:
        _refuse_4bit_fp8_in_fnuz(section, base, fnuz)
        return quantize_frozen_base(model, base.quantize, base.double_quant, recipe)
    report = PrecisionReport()
    if not (section.fp8 or section.fp4):
        return report
    left: Counter[str] = Counter()
    gathered = sharded and section.fp4_param and section.fp4_param_gather
    _swap_frozen(model, section, recipe, report, left, gathered)
    banks_stay = _swap_banks(model, section, recipe, report)
    if recipe is not None:
        _swap_trained(model, recipe, section.fp8_implementation, sharded, report, left)
        stacked = stack_fp8_groups(model)
        if stacked:
            report.lines.append(
                f"q, k and v of {stacked} block(s): one stacked FP8 product each way"
            )
    if left:
        report.lines.append(f"{_kind(left)}: in the model's dtype (widths the format cannot tile)")
    stays = "embedding, norms, attention, router, output layer"
    if any(isinstance(module, LoRALinear) for module in model.modules()):
        stays += ", LoRA adapters"
    if banks_stay:
        stays += f", {banks_stay}"
    report.lines.append(f"in the model's dtype: {stays}")
    if sharded:
        report.lines.append(_under_fsdp(model, section, gathered))
    return report


def quantize_frozen_base(
    model: Decoder, quant_type: str, double_quant: bool, fp8: Fp8Recipe | None = None
) -> PrecisionReport:
    """Every frozen projection of the decoder blocks held in 4 bits by bitsandbytes; with `fp8`
    their products in FP8 where the widths allow it."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise TuneforgeError(
            "model.quantize holds the base in 4 bits with bitsandbytes, which is not installed: "
            "pip install 'tuneforge[qlora]' (or bitsandbytes), or drop model.quantize"
        ) from None
    report = PrecisionReport()
    swapped: Counter[str] = Counter()
    in_fp8: Counter[str] = Counter()
    before = 0
    for parent, attribute, leaf, linear in _frozen_linears(model):
        low = getattr(linear, FOUR_BIT, None) or Bnb4bitLinear(linear, quant_type, double_quant)
        object.__setattr__(linear, FOUR_BIT, None)
        setattr(parent, attribute, low)
        swapped[leaf] += 1
        if fp8 is not None and fits_scaled_mm(linear.in_features, linear.out_features):
            low.compute_in_fp8(fp8)
            in_fp8[leaf] += 1
        before += linear.weight.numel() * linear.weight.element_size()
        report.weight_bytes += low.weight_bytes()
    waiting = [n for n, m in model.layers.named_modules() if getattr(m, FOUR_BIT, None) is not None]
    if waiting:  # read in 4 bits, but trained: its weight is only a placeholder
        raise TuneforgeError(
            f"model.quantize: layers.{waiting[0]} trains in full (lora.modules_to_save?), and "
            "its weight was read in 4 bits: leave the decoder blocks' projections out of "
            "modules_to_save with a 4-bit base"
        )
    if not swapped:
        return report
    double = ", absmaxes double-quantised" if double_quant else ""
    into = "the model's dtype"
    if fp8 is not None and in_fp8 == swapped:
        into = f"FP8 ({fp8.describe()}, through torch._scaled_mm)"
    report.lines.append(
        f"{_kind(swapped)}: 4-bit {quant_type.upper()} (bitsandbytes, blocks of {BNB_BLOCK}"
        f"{double}), dequantised into {into} at each product"
    )
    if fp8 is not None and in_fp8 and in_fp8 != swapped:
        report.lines.append(
            f"{_kind(in_fp8)}: products in FP8 ({fp8.describe()}, through torch._scaled_mm); "
            f"the others in the model's dtype (widths the format cannot tile)"
        )
    report.lines.append(
        f"base weights: {report.weight_bytes / GIB:.2f} GiB in 4 bits with their scales instead "
        f"of {before / GIB:.2f} GiB"
    )
    stays = "embedding, norms, attention, router, output layer, LoRA adapters"
    if any(isinstance(module, ExpertBank) for module in model.modules()):
        stays += ", expert banks (bitsandbytes has no 4-bit grouped product for stacked experts)"
    report.lines.append(f"in the model's dtype: {stays}")
    return report


def _under_fsdp(model: Decoder, section: PrecisionSection, gathered: bool) -> str:
    trained = "in the model's dtype"
    if gathers_in_fp8(model.layers):
        trained = "in FP8 (torchao's float8 all-gather)"
    if gathered:
        frozen = (
            "the FP4 codes and block scales sharded across the ranks and all-gathered as FP4 "
            "(fp4_param_gather)"
        )
    elif any(isinstance(module, LowPrecisionBase) for module in model.modules()):
        held = "FP4 codes" if section.fp4_param else "FP8 weights" if section.fp8 else "FP4 values"
        frozen = f"the frozen base's {held} replicated on every rank (quantised once, not sharded)"
    else:
        return f"under FSDP2: trained weights sharded and all-gathered {trained}"
    return f"under FSDP2: {frozen}; trained weights sharded and all-gathered {trained}"


def _swap_frozen(
    model: Decoder,
    section: PrecisionSection,
    recipe: Fp8Recipe | None,
    report: PrecisionReport,
    left: Counter[str],
    gathered: bool,
) -> None:
    swapped: Counter[str] = Counter()
    before = after = weights = 0
    for parent, attribute, leaf, linear in _frozen_linears(model):
        if not _fits(section, linear):
            left[leaf] += 1
            continue
        low = _low_precision(section, recipe, linear, gathered)
        setattr(parent, attribute, low)
        swapped[leaf] += 1
        weights += linear.weight.numel()
        before += linear.weight.numel() * linear.weight.element_size()
        after += low.weight_bytes()
    if not swapped:
        return
    report.weight_bytes = after
    report.lines.append(f"{_kind(swapped)}: {_describe(section, recipe)}")
    if section.fp8:
        kept = "kept beside them" if not section.fp8_base_weights else "dropped"
        report.lines.append(
            f"base weights: {after / GIB:.2f} GiB in FP8 with their scales (bf16 values {kept}: "
            f"{before / GIB:.2f} GiB)"
        )
    elif section.fp4_param:
        report.lines.append(
            f"base weights: {after / GIB:.2f} GiB as FP4 codes and scales "
            f"({8 * after / max(weights, 1):.2f} bits per weight) instead of {before / GIB:.2f} GiB"
        )


def _swap_banks(
    model: Decoder, section: PrecisionSection, recipe: Fp8Recipe | None, report: PrecisionReport
) -> str:
    """Frozen expert banks to FP8 through the grouped kernel; says which banks stay and why."""
    banks = [module for module in model.modules() if isinstance(module, ExpertBank)]
    if not banks:
        return ""
    if recipe is None:
        return f"expert banks ({len(banks)}: no emulated FP4 expert product)"
    device = banks[0].gate_up_proj.device
    if device.type == "cuda" and not grouped_fp8_here(device):
        return f"expert banks ({len(banks)}: this GPU has no grouped FP8 kernel)"
    rowwise = section.fp8_scaling == "rowwise"
    swapped = trained = weight_bytes = 0
    for bank in banks:
        for projection in BANK_PROJECTIONS:
            weight = getattr(bank, projection)
            if weight.requires_grad or not fits_scaled_mm(weight.shape[2], weight.shape[1]):
                trained += 1
                continue
            low = Fp8ExpertWeights(weight, rowwise, recipe.forward)
            bank.low_precision[projection] = low
            if section.fp8_base_weights:
                setattr(bank, projection, None)  # the FP8 copy is the only one
            swapped += 1
            weight_bytes += low.weight_bytes()
    if swapped:
        report.weight_bytes += weight_bytes
        report.lines.append(
            f"expert banks: {swapped} projection(s) in FP8 ({FORMAT_NAMES[recipe.forward]}, "
            f"{section.fp8_scaling}) "
            f"through torch._scaled_grouped_mm, {weight_bytes / GIB:.2f} GiB (bf16 values "
            f"{'dropped' if section.fp8_base_weights else 'kept beside them'})"
        )
    return f"expert banks ({trained} trained projection(s))" if trained else ""


def _swap_trained(
    model: Decoder,
    recipe: Fp8Recipe,
    implementation: str,
    sharded: bool,
    report: PrecisionReport,
    left: Counter[str],
) -> None:
    trained = []
    for module in model.layers.modules():
        for leaf, child in list(module.named_children()):
            if leaf not in PROJECTIONS or type(child) is not nn.Linear:
                continue
            if not any(param.requires_grad for param in child.parameters()):
                continue
            if not fits_scaled_mm(child.in_features, child.out_features):
                left[leaf] += 1
                continue
            trained.append((module, leaf, child))
    if not trained:
        return
    swap: Callable[[nn.Linear], nn.Linear]
    if implementation == "torchao":
        require_torchao()
        config = torchao_config(recipe, sharded)
        swap = partial(torchao_linear, config=config)
        how = "torchao's float8 training (Float8Linear)"
        if config.enable_fsdp_float8_all_gather:
            how += "; under FSDP2 the weights all-gathered in FP8"
    else:
        swap = partial(Fp8TrainingLinear, recipe=recipe)
        how = "torch._scaled_mm"
    for module, leaf, child in trained:
        setattr(module, leaf, swap(child))
    swapped = Counter(leaf for _, leaf, _ in trained)
    report.lines.append(
        f"{_kind(swapped)} (trained): FP8 ({recipe.describe()}) through {how} for the output "
        "and both gradients, the weights (in the model's dtype) quantised at each step"
    )


PROJECTIONS = PROJECTION_NAMES
"""The decoder's projections (a MoE router, also a linear, stays in the model's dtype)."""


def _frozen_linears(model: Decoder):
    """(parent, attribute, kind, linear) of every frozen projection in the decoder blocks: the
    base of an adapter, or a linear nothing trains."""
    for module in model.layers.modules():
        for leaf, child in module.named_children():
            if leaf not in PROJECTIONS:
                continue
            if isinstance(child, LoRALinear) and isinstance(child.base, nn.Linear):
                yield child, "base", leaf, child.base
            elif type(child) is nn.Linear and not any(p.requires_grad for p in child.parameters()):
                yield module, leaf, leaf, child


def _fits(section: PrecisionSection, linear: nn.Linear) -> bool:
    if section.fp8:
        return fits_scaled_mm(linear.in_features, linear.out_features)
    block = BLOCK_SIZE[section.fp4_recipe]
    return linear.in_features % block == 0 and linear.out_features % block == 0


def _low_precision(
    section: PrecisionSection, recipe: Fp8Recipe | None, linear: nn.Linear, gathered: bool
) -> LowPrecisionBase:
    if recipe is not None:
        return Fp8Linear(linear, recipe, keep_weight=not section.fp8_base_weights)
    return Fp4Linear(
        linear, section.fp4_recipe, packed=section.fp4_param, keep_weight=False, sharded=gathered
    )


def _kind(counts: Counter[str]) -> str:
    return "linears " + ", ".join(f"{name} ×{count}" for name, count in sorted(counts.items()))


def _describe(section: PrecisionSection, recipe: Fp8Recipe | None) -> str:
    if recipe is not None:
        return f"FP8 ({recipe.describe()}) through torch._scaled_mm, weights quantised once"
    storage = "packed FP4 codes and scales" if section.fp4_param else "dequantised values"
    return (
        f"FP4 {section.fp4_recipe.upper()} emulated (inputs and gradients quantised and "
        f"dequantised, the product in the model's dtype: slower than bf16, for comparing the "
        f"numerics); weights held as {storage}"
    )
