"""The precisions a machine cannot run, refused before anything is built, with what to do."""

import torch

from tuneforge.config.sections.model import ModelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import low_precision_cores
from tuneforge.precision.fp8 import fnuz_formats


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
    refuse_4bit_fp8_in_fnuz(section, base, fnuz_formats(device))


def refuse_4bit_fp8_in_fnuz(
    section: PrecisionSection, base: ModelSection | None, fnuz: bool
) -> None:
    if section.fp8 and fnuz and base is not None and base.quantize:
        raise TuneforgeError(
            "precision.fp8 with model.quantize dequantises the 4-bit base into OCP E4M3, which "
            "this GPU's FP8 tensor cores (MI300: FNUZ formats) do not take: drop precision.fp8 "
            "(the 4-bit products then run in the model's dtype)"
        )
