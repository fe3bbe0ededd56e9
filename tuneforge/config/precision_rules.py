"""Cross-field rules of the precision section: the formats' requirements and exclusions
(registered with `rules.rule`; `loading.py` imports this module)."""

from tuneforge.config.rules import rule


@rule("precision", "lora", "model")
def precision_formats(precision, lora, model) -> list[tuple[str, str, str]]:
    problems = []
    if precision.fp8 and model.dtype != "bfloat16":
        problems.append(
            (
                "precision.fp8",
                f"FP8 products write bfloat16 outputs; the model is {model.dtype}",
                "set model.dtype: bfloat16",
            )
        )
    if precision.fp4 and not lora.enabled:
        problems.append(
            (
                "precision.fp4",
                "emulated FP4 runs the frozen base linears of LoRA training; full fine-tuning "
                "with FP4 numerics is not available in this version",
                "set lora.enabled: true, or use precision.fp8 for full fine-tuning",
            )
        )
    if precision.fp8_base_weights and not lora.enabled:
        problems.append(
            (
                "precision.fp8_base_weights",
                "only a frozen LoRA base can be held in FP8 alone; full fine-tuning trains "
                "the weights in the model's dtype",
                "drop fp8_base_weights, or set lora.enabled: true",
            )
        )
    if precision.fp8_base_weights and not precision.fp8:
        problems.append(
            (
                "precision.fp8_base_weights",
                "fp8_base_weights requires fp8",
                "set precision.fp8: e4m3 (or hybrid), or drop fp8_base_weights",
            )
        )
    if precision.fp8_implementation != "tuneforge" and not precision.fp8:
        problems.append(
            (
                "precision.fp8_implementation",
                f"fp8_implementation: {precision.fp8_implementation} requires fp8",
                "set precision.fp8: e4m3 (or hybrid), or drop fp8_implementation",
            )
        )
    if precision.fp4 and precision.fp8:
        problems.append(
            (
                "precision.fp4",
                "fp4 and fp8 are mutually exclusive",
                "remove precision.fp8 or precision.fp4",
            )
        )
    if precision.fp4_param and not precision.fp4:
        problems.append(
            (
                "precision.fp4_param",
                "fp4_param requires fp4",
                "set precision.fp4: e2m1 or drop fp4_param",
            )
        )
    if precision.fp4_param_gather and not precision.fp4_param:
        problems.append(
            (
                "precision.fp4_param_gather",
                "fp4_param_gather requires fp4_param",
                "set precision.fp4_param: true or drop fp4_param_gather",
            )
        )
    return problems
