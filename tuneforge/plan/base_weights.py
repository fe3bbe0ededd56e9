"""How the decoder's frozen linears are held under a precision setting, and what that costs: the
formats `tuneforge.precision` swaps in, counted from the model's shape. In FP8 frozen expert banks
are swapped too (on GPUs with a grouped FP8 kernel: Hopper, MI300 and later). Biases, norms, the
embedding, the router and the output layer stay in the model's dtype."""

from dataclasses import dataclass

from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.models.args import ModelArgs
from tuneforge.precision.bnb_codes import BLOCK as BNB_BLOCK
from tuneforge.precision.bnb_codes import NESTED_BLOCK
from tuneforge.precision.fp4 import BLOCK_SIZE as FP4_BLOCK

SCALE_BYTES = {"nvfp4": 1, "mxfp4": 1}
"""NVFP4: an E4M3 scale per block (and an fp32 tensor scale); MXFP4: an E8M0 per block. In
bitsandbytes' 4-bit formats an fp32 absmax per block, or with double quantisation one byte, and
an fp32 absmax (and offset) per block of those."""


@dataclass(frozen=True)
class BaseWeights:
    format: str = "model"
    """`model` (unchanged), `fp8+model` (FP8 copies beside the model's values), `fp8`, `fp4`
    (dequantised FP4 values in the model's dtype), `nvfp4` or `mxfp4` (packed codes)."""
    rowwise: bool = True
    """FP8: one fp32 scale per output channel (else one per tensor)."""
    double_quant: bool = True
    """bitsandbytes: the absmaxes quantised again."""
    fp8_products: bool = False
    """bitsandbytes: dequantised into FP8 for each product (a byte a weight, a scale a row)."""

    @classmethod
    def of(cls, precision: PrecisionSection, model: ModelSection | None = None) -> "BaseWeights":
        if model is not None and model.quantize:
            fp8 = bool(precision.fp8)
            rowwise = precision.fp8_scaling == "rowwise"
            return cls(f"bnb-{model.quantize}", rowwise, model.double_quant, fp8_products=fp8)
        if precision.fp8:
            rowwise = precision.fp8_scaling == "rowwise"
            return cls("fp8" if precision.fp8_base_weights else "fp8+model", rowwise)
        if precision.fp4:
            return cls(precision.fp4_recipe if precision.fp4_param else "fp4")
        return cls()

    def swapped(self, args: ModelArgs) -> tuple[int, int, int]:
        """(weights, output rows, tensors) this format holds: the dense linears, in FP8 the
        expert banks too."""
        dense = frozen_linears(args)
        if not self.format.startswith("fp8"):
            return dense
        banks = expert_banks(args)
        return dense[0] + banks[0], dense[1] + banks[1], dense[2] + banks[2]

    def bytes(self, args: ModelArgs, param_bytes: int) -> tuple[float, float]:
        """(values, scales) bytes of the swapped weights."""
        weights, rows, tensors = self.swapped(args)
        if self.format in ("model", "fp4"):
            return weights * param_bytes, 0.0
        if self.format.startswith("fp8"):
            values = weights * (1 + (param_bytes if self.format == "fp8+model" else 0))
            return values, 4.0 * (rows if self.rowwise else tensors)
        if self.format.startswith("bnb"):
            blocks = weights / BNB_BLOCK
            absmax = blocks + 8.0 * blocks / NESTED_BLOCK if self.double_quant else 4.0 * blocks
            if self.fp8_products:
                # multipliers and scales (a row's, or a tensor's), and the code table
                held = 4.0 * rows + 4.0 * (rows if self.rowwise else tensors) + 64.0 * tensors
                return weights / 2, absmax + held + dequantised_buffer(args, 1)
            return weights / 2, absmax + dequantised_buffer(args, param_bytes)
        scales = weights / FP4_BLOCK[self.format] * SCALE_BYTES[self.format]
        return weights / 2, scales + (4.0 * tensors if self.format == "nvfp4" else 0.0)

    def describe(self, args: ModelArgs, param_bytes: int) -> str | None:
        if self.format == "model":
            return None
        weights = self.swapped(args)[0]
        values, scales = self.bytes(args, param_bytes)
        names = {"fp8+model": "FP8 copies beside the model's values", "fp8": "FP8",
                 "fp4": "FP4 values dequantised in the model's dtype",
                 "nvfp4": "NVFP4 codes", "mxfp4": "MXFP4 codes",
                 "bnb-nf4": "4-bit NF4 codes", "bnb-fp4": "4-bit FP4 codes"}  # fmt: skip
        if self.format.startswith("bnb"):
            buffer = dequantised_buffer(args, 1 if self.fp8_products else param_bytes)
            into = "FP8, with a scale per row" if self.fp8_products else "the model's dtype"
            return (
                f"{weights / 1e9:.2f} B base weights as {names[self.format]} (bitsandbytes): "
                f"{values / 2**30:.2f} GiB + {(scales - buffer) / 2**20:.1f} MiB of absmaxes + "
                f"{buffer / 2**20:.1f} MiB to dequantise the largest into {into} "
                f"({weights * param_bytes / 2**30:.2f} GiB in the model's dtype)"
            )
        return (
            f"{weights / 1e9:.2f} B base weights as {names[self.format]}: "
            f"{values / 2**30:.2f} GiB + {scales / 2**20:.1f} MiB of scales "
            f"({weights * param_bytes / 2**30:.2f} GiB in the model's dtype)"
        )


def dequantised_buffer(args: ModelArgs, param_bytes: int) -> float:
    """One linear's weight dequantised at a time, for its product: the largest."""
    q = args.num_heads * args.head_dim
    largest = max(args.dim * q, args.dim * args.ffn_dim if args.ffn_dim else 0)
    return float(largest * param_bytes)


def frozen_linears(args: ModelArgs) -> tuple[int, int, int]:
    """(weights, output rows, tensors) of the attention projections and dense MLPs."""
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    weights = rows = tensors = 0
    for layer in range(args.num_layers):
        weights += args.dim * (2 * q + 2 * kv)
        rows += q + 2 * kv + args.dim
        tensors += 4
        if not args.is_sparse_layer(layer):
            weights += 3 * args.dim * args.ffn_dim
            rows += 2 * args.ffn_dim + args.dim
            tensors += 3
    return weights, rows, tensors


def expert_banks(args: ModelArgs) -> tuple[int, int, int]:
    """(weights, output rows, tensors) of the MoE layers' expert banks (gate_up and down)."""
    moe = args.moe
    if moe is None:
        return 0, 0, 0
    layers = sum(args.is_sparse_layer(layer) for layer in range(args.num_layers))
    per_expert = 3 * args.dim * moe.expert_ffn_dim
    rows = 2 * moe.expert_ffn_dim + args.dim
    return (layers * moe.num_experts * per_expert, layers * moe.num_experts * rows, 2 * layers)
