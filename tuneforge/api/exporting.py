"""`tuneforge.export_merge(...)` and `tuneforge.export_gguf(...)`: a run's adapter folded into
its base as a Hugging Face checkpoint, and a GGUF file for llama.cpp."""

from pathlib import Path


def export_merge(
    run: str | Path | None,
    out: str | Path,
    *,
    base: str | Path | None = None,
    adapter: str | Path | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Fold the adapter of `run` (a run, adapter or model directory; or `base` with `adapter`)
    into its base and write sharded safetensors, config, tokenizer and generation config to
    `out`. `dtype`: bfloat16, float16 or float32 (default: the base's). Returns `out`."""
    from tuneforge.export.sources import resolve_source

    source = resolve_source(_path(run), _path(base), _path(adapter))  # before the heavy imports
    from tuneforge.export.merge import export_merged

    return export_merged(source, Path(out), dtype, overwrite)


def export_gguf(
    model: str | Path | None,
    out: str | Path,
    *,
    quant: str = "f16",
    base: str | Path | None = None,
    adapter: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `model` (a run, adapter or model directory; or `base` with `adapter`) as one GGUF
    file, tokenizer and chat template included. `quant`: f16 or q8_0 (the gguf package), q4_k_m,
    q5_k_m or q6_k (llama.cpp's quantiser). Returns the file written."""
    from tuneforge.export.sources import resolve_source

    source = resolve_source(_path(model), _path(base), _path(adapter))
    from tuneforge.export.gguf_file import export_gguf as write_gguf

    return write_gguf(source, Path(out), quant, overwrite)


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
