"""What a finished run leaves: the final weights or the adapter, and a random-init base. A
write that fails (a full disk, a file system gone read-only) leaves no half-written directory
and says where, how much room there is, and how to carry on."""

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError

from tuneforge.errors import TuneforgeError
from tuneforge.hardware.gpus import GIB
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import save_hf_model
from tuneforge.models.score_head import score_head_of
from tuneforge.peft.adapter_io import save_adapter
from tuneforge.peft.apply import lora_modules, merged_weights
from tuneforge.runs.files import ADAPTER_DIR, BASE_DIR, FINAL_DIR


def save_final(
    run_dir: Path,
    model: Decoder,
    tokenizer,
    base_model: str,
    write: bool = True,
    dtype: str | None = None,
) -> Path:
    """The adapter (PEFT layout) for LoRA runs, else the full model (HF layout with tokenizer),
    its weights in `dtype` (the model's: FSDP2's fp32 master shards are saved rounded to it); a
    reward model whole, as a sequence classifier, its adapters folded in. Under FSDP every rank
    calls it and one writes (`write`)."""
    scorer = score_head_of(model) is not None
    out = run_dir / (ADAPTER_DIR if lora_modules(model) and not scorer else FINAL_DIR)
    carry_on = "run the same command with --resume auto to redo the steps since the last checkpoint"
    with _written(out, "the trained weights", carry_on):
        if out.name == ADAPTER_DIR:
            save_adapter(model, out, base_model, write=write)
        elif scorer:
            save_hf_model(model, out, dtype, write=write, state=merged_weights(model))
        else:
            save_hf_model(model, out, dtype, write=write)
        if write:
            tokenizer.save_pretrained(str(out))
    return out


def save_base(run_dir: Path, model: Decoder, tokenizer) -> Path:
    """A random-init base saved next to its adapter, so the adapter can be used later."""
    out = run_dir / BASE_DIR
    with _written(out, "the random-init base model", "start the run again"):
        save_hf_model(model, out)
        tokenizer.save_pretrained(str(out))
    return out


@contextlib.contextmanager
def _written(out: Path, what: str, carry_on: str) -> Iterator[None]:
    try:
        yield
    except (OSError, SafetensorError) as error:
        shutil.rmtree(out, ignore_errors=True)
        existing = next(p for p in (out, *out.parents) if p.exists())
        free = shutil.disk_usage(existing).free / GIB
        raise TuneforgeError(
            f"{out}: writing {what} failed ({error}); {free:.1f} GiB free there. Free space (or "
            f"set run.output_dir on a larger file system), then {carry_on}"
        ) from None
