"""tuneforge: fine-tune large language models, and know before launch whether the run fits."""

from tuneforge.models.api import load_model, save_model

__version__ = "0.1.0"
__all__ = ["load_model", "save_model"]
