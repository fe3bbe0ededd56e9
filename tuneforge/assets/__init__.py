"""Bundled demo assets: a small chat tokenizer and a set of simple deterministic tasks."""

from pathlib import Path

ASSETS_DIR = Path(__file__).parent
DEMO_TOKENIZER_DIR = ASSETS_DIR / "demo_tokenizer"
DEMO_DATA_DIR = ASSETS_DIR / "demo_data"
