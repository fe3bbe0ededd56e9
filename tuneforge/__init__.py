"""tuneforge: fine-tune large language models, and know before launch whether the run fits."""

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "tuneforge.models.api",
    "save_model": "tuneforge.models.api",
    "apply_lora": "tuneforge.peft.apply",
    "merge_lora": "tuneforge.peft.apply",
    "save_adapter": "tuneforge.peft.adapter_io",
    "load_adapter": "tuneforge.peft.adapter_io",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    # Imported on first use, so that `import tuneforge.data` (and its worker processes) stay
    # free of torch.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tuneforge' has no attribute {name!r}")
