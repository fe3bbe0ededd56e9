"""tuneforge: fine-tune large language models, and know before launch whether the run fits."""

__version__ = "0.1.0"
__all__ = ["load_model", "save_model"]


def __getattr__(name: str):
    # Imported on first use, so that `import tuneforge.data` (and its worker processes) stay
    # free of torch.
    if name in __all__:
        from tuneforge.models import api

        return getattr(api, name)
    raise AttributeError(f"module 'tuneforge' has no attribute {name!r}")
