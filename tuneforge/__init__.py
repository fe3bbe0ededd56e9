"""tuneforge: fine-tune large language models, and know before launch whether the run fits."""

__version__ = "0.1.0"
