"""`precision:` low-precision matmuls and the trained weights' master copies."""

from typing import Literal

from tuneforge.config.sections.base import Section


class PrecisionSection(Section):
    fp8: Literal["e4m3", "hybrid"] | None = None
    """FP8 matmuls (`e4m3` or `hybrid`: E4M3 forward, E5M2 backward); mutually exclusive with fp4.
    With model.quantize: the 4-bit base dequantised into FP8 for each product."""
    fp8_scaling: Literal["rowwise", "tensorwise"] = "rowwise"
    """FP8 scales: one per token and output channel (`rowwise`) or one per tensor (`tensorwise`)."""
    fp8_implementation: Literal["tuneforge", "torchao"] = "tuneforge"
    """Full fine-tuning's trained linears in FP8 through tuneforge's own `torch._scaled_mm` products
    or torchao's float8 training (`Float8Linear`; needs torchao; under FSDP2 with tensorwise scales
    it all-gathers the weights in FP8). Frozen LoRA bases always use tuneforge's, quantised once."""
    fp8_base_weights: bool = False
    """LoRA: keep the frozen base weights only in FP8 (about half the memory); otherwise their bf16
    values stay beside the FP8 copy."""
    fp4: Literal["e2m1"] | None = None
    """FP4 numerics (E2M1 elements with block scales) for the frozen base linears, emulated
    (quantise, dequantise, bf16 product) where the GPU has no FP4 tensor cores; mutually exclusive
    with fp8."""
    fp4_recipe: Literal["nvfp4", "mxfp4"] = "nvfp4"
    """FP4 block-scaling recipe."""
    fp4_param: bool = False
    """Keep the frozen base weights only as FP4 codes and scales, dequantised at each use (requires
    fp4)."""
    fp4_param_gather: bool = False
    """All-gather weights in FP4 (requires fp4_param)."""
    master_weights: bool | Literal["compensated"] = True
    """Trained 16-bit weights (full fine-tuning, lora.modules_to_save): `true` keeps an fp32 master
    copy of each and fp32 AdamW states, computing in the model's dtype (under FSDP2 the shards are
    the fp32 masters); `false` keeps weights and AdamW states in the model's dtype only (half the
    optimizer memory, but updates below half a bf16 step are lost); `compensated` keeps the weights
    in the model's dtype plus a same-size remainder of what rounding took off (Kahan), with fp32
    states."""
