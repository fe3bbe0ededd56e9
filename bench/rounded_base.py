"""A model directory whose decoder projections are rounded through a low-precision format and
stored back in their dtype: the weights-only half of that format's numerics, for separating
what rounding the base does to an A/B from what rounding activations and gradients does.

    python bench/rounded_base.py SRC_DIR DST_DIR fp8|nvfp4|mxfp4

fp8: E4M3 with one scale per output channel, as `precision.fp8` quantises a frozen base;
nvfp4 / mxfp4: square tiles, as `precision.fp4` does."""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tuneforge.precision.fp4 import quantize_fp4
from tuneforge.precision.fp8 import E4M3, dequantize, quantize

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rounded(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "fp8":
        values, scale = quantize(weight, E4M3, rowwise=True)
        return dequantize(values, scale, weight.dtype)
    return quantize_fp4(weight, fmt, square=True).dequantize(weight.dtype)


def main(source: Path, target: Path, fmt: str) -> None:
    if fmt not in ("fp8", "nvfp4", "mxfp4"):
        raise SystemExit(f"format {fmt!r}: fp8, nvfp4 or mxfp4")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    count = 0
    for file in sorted(source.glob("*.safetensors")):
        tensors = load_file(file)
        for name, tensor in tensors.items():
            if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS:
                tensors[name] = rounded(tensor, fmt)
                count += 1
        save_file(tensors, target / file.name, metadata={"format": "pt"})
    print(f"{target}: {count} projections rounded through {fmt}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
