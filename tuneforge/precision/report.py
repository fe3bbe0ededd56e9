"""What a precision did to a model, in words for the run's log: one line per kind of module, from
what each converter returned (`converters.py`)."""

import logging
from collections import Counter
from dataclasses import dataclass, field

from torch import nn

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.hardware.gpus import GIB
from tuneforge.models.decoder import Decoder
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.lora import LoRALinear, LowPrecisionBase
from tuneforge.precision.bnb_codes import BLOCK as BNB_BLOCK
from tuneforge.precision.converters import BanksSwapped, FourBitSwapped, Swapped, TrainedSwapped
from tuneforge.precision.fp8 import FORMAT_NAMES, Fp8Recipe
from tuneforge.precision.torchao_training import gathers_in_fp8


@dataclass
class PrecisionReport:
    """What `apply_precision` did, for the log: one line per kind of module."""

    lines: list[str] = field(default_factory=list)
    weight_bytes: int = 0
    """Bytes of the low-precision weights and their scales."""

    def log(self, logger: logging.Logger) -> None:
        for line in self.lines:
            logger.info("precision: %s", line)


def kinds(counts: Counter[str]) -> str:
    return "linears " + ", ".join(f"{name} ×{count}" for name, count in sorted(counts.items()))


def describe_frozen(
    section: PrecisionSection, recipe: Fp8Recipe | None, done: Swapped
) -> list[str]:
    if not done.kinds:
        return []
    if recipe is not None:
        how = f"FP8 ({recipe.describe()}) through torch._scaled_mm, weights quantised once"
    else:
        storage = "packed FP4 codes and scales" if section.fp4_param else "dequantised values"
        how = (
            f"FP4 {section.fp4_recipe.upper()} emulated (inputs and gradients quantised and "
            f"dequantised, the product in the model's dtype: slower than bf16, for comparing the "
            f"numerics); weights held as {storage}"
        )
    lines = [f"{kinds(done.kinds)}: {how}"]
    after, before = done.bytes_after / GIB, done.bytes_before / GIB
    if section.fp8:
        kept = "kept beside them" if not section.fp8_base_weights else "dropped"
        lines.append(
            f"base weights: {after:.2f} GiB in FP8 with their scales (bf16 values {kept}: "
            f"{before:.2f} GiB)"
        )
    elif section.fp4_param:
        bits = 8 * done.bytes_after / max(done.weights, 1)
        lines.append(
            f"base weights: {after:.2f} GiB as FP4 codes and scales ({bits:.2f} bits per "
            f"weight) instead of {before:.2f} GiB"
        )
    return lines


def describe_banks(
    section: PrecisionSection, recipe: Fp8Recipe | None, done: BanksSwapped
) -> tuple[list[str], str]:
    """(lines, what stays in the model's dtype: "" when nothing does)."""
    if done.stay_because == "fp4":
        return [], f"expert banks ({done.banks}: no emulated FP4 expert product)"
    if done.stay_because is not None:
        return [], f"expert banks ({done.banks}: this GPU has no grouped FP8 kernel)"
    lines = []
    if done.projections:
        assert recipe is not None
        kept = "dropped" if section.fp8_base_weights else "kept beside them"
        lines.append(
            f"expert banks: {done.projections} projection(s) in FP8 "
            f"({FORMAT_NAMES[recipe.forward]}, {section.fp8_scaling}) through "
            f"torch._scaled_grouped_mm, {done.weight_bytes / GIB:.2f} GiB (bf16 values {kept})"
        )
    stays = f"expert banks ({done.trained} trained projection(s))" if done.trained else ""
    return lines, stays


def describe_trained(recipe: Fp8Recipe, implementation: str, done: TrainedSwapped) -> list[str]:
    if not done.kinds:
        return []
    how = "torch._scaled_mm"
    if implementation == "torchao":
        how = "torchao's float8 training (Float8Linear)"
        if done.fp8_gather:
            how += "; under FSDP2 the weights all-gathered in FP8"
    return [
        f"{kinds(done.kinds)} (trained): FP8 ({recipe.describe()}) through {how} for the output "
        "and both gradients, the weights (in the model's dtype) quantised at each step"
    ]


def in_model_dtype(model: Decoder, banks_stay: str) -> str:
    stays = "embedding, norms, attention, router, output layer"
    if any(isinstance(module, LoRALinear) for module in model.modules()):
        stays += ", LoRA adapters"
    if banks_stay:
        stays += f", {banks_stay}"
    return f"in the model's dtype: {stays}"


def under_fsdp(model: Decoder, section: PrecisionSection, gathered: bool) -> str:
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


def describe_four_bit(
    model: nn.Module, quant_type: str, double_quant: bool, fp8: Fp8Recipe | None,
    done: FourBitSwapped,
) -> list[str]:  # fmt: skip
    if not done.kinds:
        return []
    double = ", absmaxes double-quantised" if double_quant else ""
    into = "the model's dtype"
    if fp8 is not None and done.in_fp8 == done.kinds:
        into = f"FP8 ({fp8.describe()}, through torch._scaled_mm)"
    lines = [
        f"{kinds(done.kinds)}: 4-bit {quant_type.upper()} (bitsandbytes, blocks of {BNB_BLOCK}"
        f"{double}), dequantised into {into} at each product"
    ]
    if fp8 is not None and done.in_fp8 and done.in_fp8 != done.kinds:
        lines.append(
            f"{kinds(done.in_fp8)}: products in FP8 ({fp8.describe()}, through torch._scaled_mm); "
            f"the others in the model's dtype (widths the format cannot tile)"
        )
    lines.append(
        f"base weights: {done.bytes_after / GIB:.2f} GiB in 4 bits with their scales instead "
        f"of {done.bytes_before / GIB:.2f} GiB"
    )
    stays = "embedding, norms, attention, router, output layer, LoRA adapters"
    if any(isinstance(module, ExpertBank) for module in model.modules()):
        stays += ", expert banks (bitsandbytes has no 4-bit grouped product for stacked experts)"
    lines.append(f"in the model's dtype: {stays}")
    return lines
