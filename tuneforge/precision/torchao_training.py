"""Trained linears (full fine-tuning) through torchao's float8 training, the reference
implementation, as `precision.fp8_implementation: torchao` asks: torchao's `Float8Linear` with
our recipe's formats and scaling. Under FSDP2 with tensorwise scales, torchao all-gathers the
weights in FP8 (its `enable_fsdp_float8_all_gather`); rowwise scales gather in the model's dtype."""

from torch import nn

from tuneforge.errors import TuneforgeError
from tuneforge.precision.fp8 import Fp8Recipe


def torchao_config(recipe: Fp8Recipe, sharded: bool = False):
    """torchao's `Float8LinearConfig` for `recipe`: the forward's and the output gradients' formats,
    one scale per tensor or per row of each product's operands (torchao's `AXISWISE`); its rowwise
    scales rounded to powers of two, as its own rowwise recipe does; products whose reduction is
    not a multiple of 16 padded with zeros (torchao's `pad_inner_dim`)."""
    from torchao.float8.config import CastConfig, Float8LinearConfig, ScalingGranularity

    rowwise = recipe.scaling == "rowwise"
    granularity = ScalingGranularity.AXISWISE if rowwise else ScalingGranularity.TENSORWISE
    forward = CastConfig(scaling_granularity=granularity, target_dtype=recipe.forward)
    return Float8LinearConfig(
        cast_config_input=forward,
        cast_config_weight=forward,
        cast_config_grad_output=CastConfig(
            scaling_granularity=granularity, target_dtype=recipe.backward
        ),
        round_scales_to_power_of_2=rowwise,
        pad_inner_dim=True,  # a run's token counts vary: the weight gradient reduces over them
        enable_fsdp_float8_all_gather=sharded and not rowwise,
    )


def torchao_linear(linear: nn.Linear, config) -> nn.Linear:
    """`linear` as torchao's `Float8Linear`, sharing its parameters (the same state dict)."""
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear.from_float(linear, config=config)


def gathers_in_fp8(module: nn.Module) -> bool:
    """Whether any of `module`'s linears is torchao's with its weight all-gathered in FP8."""
    return any(
        getattr(getattr(child, "config", None), "enable_fsdp_float8_all_gather", False)
        for child in module.modules()
    )


def require_torchao() -> None:
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise TuneforgeError(
            "precision.fp8_implementation: torchao runs the trained linears through torchao's "
            "float8 training, and torchao is not installed: pip install torchao, or set "
            "fp8_implementation: tuneforge"
        ) from None
