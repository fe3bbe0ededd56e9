"""What a run leaves on disk: step checkpoints (atomic), the final weights or adapter."""

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import save_hf_model
from tuneforge.peft.adapter_io import save_adapter
from tuneforge.peft.apply import lora_modules

CHECKPOINTS = "checkpoints"
FINAL_DIR = "final"
ADAPTER_DIR = "adapter"
BASE_DIR = "base"
TRAINABLE_FILE = "trainable.safetensors"
STATE_FILE = "state.json"


def save_step_checkpoint(
    run_dir: Path, model: torch.nn.Module, step: int, state: dict[str, Any], keep_last: int
) -> Path:
    """Trainable tensors and loop state of `step`, written to a temporary directory then renamed."""
    root = run_dir / CHECKPOINTS
    final = root / f"step_{step}"
    partial = root / f".step_{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    tensors = {
        name: param.detach().cpu().contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    save_file(tensors, str(partial / TRAINABLE_FILE))
    (partial / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    (root / "latest").write_text(final.name + "\n")
    steps = sorted((int(p.name.split("_")[1]), p) for p in root.glob("step_*") if p.is_dir())
    for _, old in steps[:-keep_last]:
        shutil.rmtree(old)
    return final


def save_final(run_dir: Path, model: Decoder, tokenizer, base_model: str) -> Path:
    """The adapter (PEFT layout) for LoRA runs, else the full model (HF layout with tokenizer)."""
    if lora_modules(model):
        out = run_dir / ADAPTER_DIR
        save_adapter(model, out, base_model)
    else:
        out = run_dir / FINAL_DIR
        save_hf_model(model, out)
    tokenizer.save_pretrained(str(out))
    return out


def save_base(run_dir: Path, model: Decoder, tokenizer) -> Path:
    """A random-init base saved next to its adapter, so the adapter can be used later."""
    out = run_dir / BASE_DIR
    save_hf_model(model, out)
    tokenizer.save_pretrained(str(out))
    return out
