"""What a finished run leaves: the final weights or the adapter, and a random-init base."""

from pathlib import Path

from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import save_hf_model
from tuneforge.peft.adapter_io import save_adapter
from tuneforge.peft.apply import lora_modules
from tuneforge.runs.files import ADAPTER_DIR, BASE_DIR, FINAL_DIR


def save_final(
    run_dir: Path, model: Decoder, tokenizer, base_model: str, write: bool = True
) -> Path:
    """The adapter (PEFT layout) for LoRA runs, else the full model (HF layout with tokenizer).
    Under FSDP every rank calls it and one writes (`write`)."""
    if lora_modules(model):
        out = run_dir / ADAPTER_DIR
        save_adapter(model, out, base_model, write=write)
    else:
        out = run_dir / FINAL_DIR
        save_hf_model(model, out, write=write)
    if write:
        tokenizer.save_pretrained(str(out))
    return out


def save_base(run_dir: Path, model: Decoder, tokenizer) -> Path:
    """A random-init base saved next to its adapter, so the adapter can be used later."""
    out = run_dir / BASE_DIR
    save_hf_model(model, out)
    tokenizer.save_pretrained(str(out))
    return out
