"""Load what a finished run saved, ready for generation: full weights, or base + adapter. Only
the model, the adapter and the tokenizer are needed: a run whose training data has moved since
still loads."""

from pathlib import Path
from typing import Any

import torch
import yaml

from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.adapter_io import load_adapter, read_adapter_config
from tuneforge.runs.files import ADAPTER_DIR, CONFIG_FILE, FINAL_DIR


def chat_tokenizer(directory: Path):
    """The tokenizer saved in `directory`, refused without a chat template to render turns."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if not tokenizer.chat_template:
        raise TuneforgeError(
            f"{directory}: its tokenizer has no chat template to render the conversation with; "
            "use a chat model (or a run of one), or add a template (tokenizer.chat_template in "
            "the run's configuration, then train)"
        )
    return tokenizer


def load_trained(run_dir: Path, device: torch.device) -> tuple[Decoder, Any]:
    """The trained model of `run_dir` (or the model of a Hugging Face model directory) and its
    tokenizer, which must have a chat template (checked before the weights load)."""
    if not (run_dir / CONFIG_FILE).is_file() and (run_dir / "config.json").is_file():
        dtype = "bfloat16" if device.type == "cuda" else "float32"  # a model directory
        tokenizer = chat_tokenizer(run_dir)
        model = load_hf_model(run_dir, dtype, "sdpa")
        return model.to(device).eval(), tokenizer
    if not (run_dir / CONFIG_FILE).is_file():
        raise TuneforgeError(
            f"{run_dir} is neither a run directory (no {CONFIG_FILE}) nor a model directory "
            "(no config.json)"
        )
    # the saved (already validated) configuration, read for the dtype alone: its data may
    # have moved since, which generation does not need
    saved = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    dtype = (saved.get("model") or {}).get("dtype", "bfloat16")
    if (run_dir / ADAPTER_DIR).is_dir():
        adapter_dir = run_dir / ADAPTER_DIR
        tokenizer = chat_tokenizer(adapter_dir)
        adapter_config = read_adapter_config(adapter_dir)
        model = load_hf_model(Path(adapter_config["base_model_name_or_path"]), dtype, "sdpa")
        load_adapter(model, adapter_dir, dtype=torch.float32)
    elif (run_dir / FINAL_DIR).is_dir():
        tokenizer = chat_tokenizer(run_dir / FINAL_DIR)
        model = load_hf_model(run_dir / FINAL_DIR, dtype, "sdpa")
    else:
        raise TuneforgeError(
            f"{run_dir} holds no trained weights ({FINAL_DIR}/ or {ADAPTER_DIR}/): did it finish?"
        )
    return model.to(device).eval(), tokenizer
