"""The GGUF quantisations users deploy (`q4_k_m`, `q5_k_m`, `q6_k`): llama.cpp's own quantiser,
through `llama-cpp-python` (the `llamacpp` extra), from the F16 file tuneforge writes. The `gguf`
package quantises only `q8_0` (written directly); the k-quants need llama.cpp."""

import ctypes
from pathlib import Path

from tuneforge.export.sources import ExportError

LLAMA_CPP_TYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
                   "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K"}  # fmt: skip
"""--type -> llama.cpp's file type."""


def quantize_with_llama_cpp(f16: Path, out: Path, kind: str) -> None:
    """`f16` (a GGUF file in F16) quantised to `kind` into `out` by llama.cpp."""
    try:
        import llama_cpp
    except ImportError:
        raise ExportError(
            f"--type {kind} is quantised by llama.cpp: pip install 'tuneforge[llamacpp]' "
            "(llama-cpp-python), or write f16 and run llama.cpp's llama-quantize on it "
            "(f16 and q8_0 need only the gguf package)"
        ) from None
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, LLAMA_CPP_TYPES[kind])
    status = llama_cpp.llama_model_quantize(
        str(f16).encode(), str(out).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise ExportError(f"llama.cpp could not quantise {f16} to {kind} (status {status})")
