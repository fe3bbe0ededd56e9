"""Load what a finished run saved, ready for generation: full weights, or base + adapter."""

from pathlib import Path
from typing import Any

import torch

from tuneforge.config import load_config
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.adapter_io import load_adapter, read_adapter_config
from tuneforge.runs.files import ADAPTER_DIR, CONFIG_FILE, FINAL_DIR


def load_trained(run_dir: Path, device: torch.device) -> tuple[Decoder, Any]:
    """The trained model of `run_dir` (or the model of a Hugging Face model directory) and its
    tokenizer."""
    from transformers import AutoTokenizer

    if not (run_dir / CONFIG_FILE).is_file() and (run_dir / "config.json").is_file():
        dtype = "bfloat16" if device.type == "cuda" else "float32"  # a model directory
        model = load_hf_model(run_dir, dtype, "sdpa")
        tokenizer = AutoTokenizer.from_pretrained(str(run_dir), local_files_only=True)
        return model.to(device).eval(), tokenizer
    if not (run_dir / CONFIG_FILE).is_file():
        raise TuneforgeError(
            f"{run_dir} is neither a run directory (no {CONFIG_FILE}) nor a model directory "
            "(no config.json)"
        )
    config = load_config(run_dir / CONFIG_FILE)
    dtype = config.model.dtype
    if (run_dir / ADAPTER_DIR).is_dir():
        adapter_dir = run_dir / ADAPTER_DIR
        adapter_config = read_adapter_config(adapter_dir)
        base = Path(adapter_config["base_model_name_or_path"])
        model = load_hf_model(base, dtype, "sdpa")
        load_adapter(model, adapter_dir, dtype=torch.float32)
        tokenizer_dir = adapter_dir
    elif (run_dir / FINAL_DIR).is_dir():
        model = load_hf_model(run_dir / FINAL_DIR, dtype, "sdpa")
        tokenizer_dir = run_dir / FINAL_DIR
    else:
        raise TuneforgeError(
            f"{run_dir} holds no trained weights ({FINAL_DIR}/ or {ADAPTER_DIR}/): did it finish?"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return model.to(device).eval(), tokenizer
