"""Put a run's precision on its model: the converters its precision section asks for
(`converters.py`), run in order, and the report of what runs in which precision
(`report.py`). Everything the converters do not touch stays as it is; what the machine cannot
run was refused before (`refusals.py`)."""

from collections import Counter

from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.decoder import Decoder
from tuneforge.precision.converters import (
    ArrivedFourBit,
    FourBitBase,
    Fp8ExpertBanks,
    Fp8Trained,
    FrozenLowPrecision,
)
from tuneforge.precision.fp8 import Fp8Recipe, fnuz_formats
from tuneforge.precision.refusals import refuse_4bit_fp8_in_fnuz
from tuneforge.precision.report import (
    PrecisionReport,
    describe_banks,
    describe_four_bit,
    describe_frozen,
    describe_trained,
    in_model_dtype,
    kinds,
    under_fsdp,
)
from tuneforge.precision.stacked_fp8 import stack_fp8_groups


def apply_precision(
    model: Decoder,
    section: PrecisionSection,
    sharded: bool = False,
    base: ModelSection | None = None,
    arrived: ArrivedFourBit | None = None,
) -> PrecisionReport:
    """Swap the decoder blocks' projections for low-precision ones as `section` says: frozen
    ones (a LoRA base) for FP8 or FP4 ones, trained ones (full fine-tuning) for FP8 ones; or,
    with `base.quantize`, the frozen ones for bitsandbytes' 4-bit ones (QLoRA; `arrived`: those
    quantised as the model was read). `sharded`: the model is about to be sharded by FSDP2."""
    fnuz = fnuz_formats(next(model.parameters()).device)
    recipe = Fp8Recipe.of(section.fp8, section.fp8_scaling, fnuz) if section.fp8 else None
    if base is not None and base.quantize:
        refuse_4bit_fp8_in_fnuz(section, base, fnuz)
        return quantize_frozen_base(model, base.quantize, base.double_quant, recipe, arrived)
    report = PrecisionReport()
    if not (section.fp8 or section.fp4):
        return report
    gathered = sharded and section.fp4_param and section.fp4_param_gather
    frozen = FrozenLowPrecision(section, recipe, gathered).convert(model)
    report.weight_bytes = frozen.bytes_after
    report.lines += describe_frozen(section, recipe, frozen)
    rowwise = section.fp8_scaling == "rowwise"
    banks = Fp8ExpertBanks(recipe, rowwise, section.fp8_base_weights).convert(model)
    report.weight_bytes += banks.weight_bytes
    bank_lines, banks_stay = describe_banks(section, recipe, banks)
    report.lines += bank_lines
    left = Counter(frozen.left)
    if recipe is not None:
        implementation = section.fp8_implementation
        trained = Fp8Trained(recipe, implementation, sharded).convert(model)
        left += trained.left
        report.lines += describe_trained(recipe, implementation, trained)
        stacked = stack_fp8_groups(model)
        if stacked:
            report.lines.append(
                f"q, k and v of {stacked} block(s): one stacked FP8 product each way"
            )
    if left:
        report.lines.append(f"{kinds(left)}: in the model's dtype (widths the format cannot tile)")
    report.lines.append(in_model_dtype(model, banks_stay))
    if sharded:
        report.lines.append(under_fsdp(model, section, gathered))
    return report


def quantize_frozen_base(
    model: Decoder,
    quant_type: str,
    double_quant: bool,
    fp8: Fp8Recipe | None = None,
    arrived: ArrivedFourBit | None = None,
) -> PrecisionReport:
    """Every frozen projection of the decoder blocks held in 4 bits by bitsandbytes; with `fp8`
    their products in FP8 where the widths allow it."""
    done = FourBitBase(quant_type, double_quant, fp8, arrived).convert(model)
    lines = describe_four_bit(model, quant_type, double_quant, fp8, done)
    return PrecisionReport(lines, done.bytes_after)
