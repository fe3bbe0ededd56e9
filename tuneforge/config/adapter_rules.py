"""Cross-field rules of the adapters' variants: QLoRA's 4-bit base, DoRA, and initialisations
from the base weights (registered with `rules.rule`; `loading.py` imports this module)."""

from tuneforge.config.rules import rule


@rule("model", "lora", "precision")
def quantized_base_is_frozen(model, lora, precision) -> list[tuple[str, str, str]]:
    if not model.quantize:
        return []
    problems = []
    if not lora.enabled:
        problems.append(
            (
                "model.quantize",
                "a 4-bit base cannot train: model.quantize holds the frozen base of LoRA",
                "set lora.enabled: true (QLoRA), or drop model.quantize",
            )
        )
    if precision.fp4 or precision.fp8_base_weights:
        setting = "precision.fp4" if precision.fp4 else "precision.fp8_base_weights"
        problems.append(
            (
                "model.quantize",
                f"the frozen base is held in one format: 4 bits (model.quantize) or {setting}",
                f"drop model.quantize or {setting} (precision.fp8 alone multiplies the 4-bit "
                "base in FP8)",
            )
        )
    if lora.init in ("pissa", "olora"):
        problems.append(
            (
                "lora.init",
                f"{lora.init} decomposes the base weights, and model.quantize holds them in 4 bits",
                "use lora.init default with a 4-bit base",
            )
        )
    if lora.use_dora:
        problems.append(
            (
                "lora.use_dora",
                "DoRA needs the base weights' norms, and model.quantize holds them in 4 bits",
                "drop lora.use_dora, or model.quantize",
            )
        )
    return problems


@rule("lora")
def decomposed_init_starts_from_the_base(lora) -> list[tuple[str, str, str]]:
    if not (lora.enabled and lora.init in ("pissa", "olora")):
        return []
    problems = []
    if lora.init_adapter is not None:
        problems.append(
            (
                "lora.init",
                f"{lora.init} initialises the adapters from the base weights, and "
                "lora.init_adapter starts them from an adapter",
                "drop one of lora.init and lora.init_adapter",
            )
        )
    if lora.use_dora:
        problems.append(
            ("lora.init", f"{lora.init} with DoRA is not supported", "use init default with DoRA")
        )
    return problems


@rule("precision", "lora")
def dora_needs_the_base_weights(precision, lora) -> list[tuple[str, str, str]]:
    low = precision.fp8 or precision.fp4
    if not (lora.enabled and lora.use_dora and low):
        return []
    return [
        (
            "lora.use_dora",
            "DoRA divides by the norms of W + s·B·A, and with precision.fp8 or fp4 the frozen "
            "base computes in a low-precision format",
            "drop lora.use_dora, or the low precision",
        )
    ]
