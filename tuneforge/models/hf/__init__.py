"""Hugging Face interop: per-family state-dict adapters and safetensors checkpoint I/O."""

from tuneforge.models.hf.adapter import ADAPTERS, StateDictAdapter, adapter_for
from tuneforge.models.hf.checkpoint import load_hf_model, read_hf_config, save_hf_model

__all__ = [
    "ADAPTERS",
    "StateDictAdapter",
    "adapter_for",
    "load_hf_model",
    "read_hf_config",
    "save_hf_model",
]
