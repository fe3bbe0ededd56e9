"""What to export: a model directory, a base plus an adapter, or a `tuneforge train` run."""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from tuneforge.errors import TuneforgeError
from tuneforge.runs.files import ADAPTER_DIR, CONFIG_FILE, FINAL_DIR


class ExportError(TuneforgeError):
    """Export inputs or outputs that cannot be used as they are."""


@dataclass(frozen=True)
class ExportSource:
    base: Path
    """A Hugging Face model directory (the merged result when `adapter` is None)."""
    adapter: Path | None = None
    """A PEFT-layout adapter directory to merge into `base`."""
    quantized: tuple[str, bool] | None = None
    """(quant type, double quantisation) of a QLoRA run's 4-bit base, which the adapter was
    trained against: the merge goes into those values (`export/merge.py`)."""

    @property
    def tokenizer_dir(self) -> Path:
        """Where the tokenizer comes from: the adapter's directory when it holds one (a run saves
        the tokenizer it trained with there), else the base's."""
        if self.adapter is not None and (self.adapter / "tokenizer_config.json").is_file():
            return self.adapter
        return self.base

    @property
    def inputs(self) -> tuple[Path, ...]:
        """The directories the export reads: its output may be none of them, nor hold one."""
        return (self.base,) if self.adapter is None else (self.base, self.adapter)


def resolve_source(
    path: Path | None = None, base: Path | None = None, adapter: Path | None = None
) -> ExportSource:
    """`path` is a run directory or a model directory; or give `base` (and `adapter`)."""
    if path is not None and (base is not None or adapter is not None):
        raise ExportError("give a run or model directory, or --base (with --adapter), not both")
    if path is not None:
        if (path / ADAPTER_DIR / "adapter_config.json").is_file():
            source = _from_adapter(path / ADAPTER_DIR)
            return replace(source, quantized=_quantized_base(path))
        if (path / FINAL_DIR / "config.json").is_file():
            return ExportSource(path / FINAL_DIR)
        if (path / "adapter_config.json").is_file():
            return _from_adapter(path)
        if (path / "config.json").is_file():
            return ExportSource(path)
        raise ExportError(
            f"{path} is neither a finished run (with {ADAPTER_DIR}/ or {FINAL_DIR}/), "
            "an adapter directory, nor a model directory (config.json)"
        )
    if base is None:
        raise ExportError("give a run or model directory, or --base DIR (with --adapter DIR)")
    if not (base / "config.json").is_file():
        raise ExportError(f"--base {base}: no config.json; is it a Hugging Face model directory?")
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"--adapter {adapter}: no adapter_config.json")
    return ExportSource(base, adapter)


def _quantized_base(run: Path) -> tuple[str, bool] | None:
    """A run's `model.quantize` as its config.yaml records it."""
    config_file = run / CONFIG_FILE
    if not config_file.is_file():
        return None
    model = (yaml.safe_load(config_file.read_text()) or {}).get("model") or {}
    if not model.get("quantize"):
        return None
    return model["quantize"], bool(model.get("double_quant", True))


def _from_adapter(adapter: Path) -> ExportSource:
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = Path(config.get("base_model_name_or_path") or "")
    if not (base / "config.json").is_file():
        raise ExportError(
            f"{adapter}: its base model {str(base)!r} (base_model_name_or_path) is not a local "
            "model directory; pass --base DIR --adapter DIR"
        )
    return ExportSource(base, adapter)
