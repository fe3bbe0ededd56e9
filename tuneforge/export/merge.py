"""`tuneforge export merge`: fold an adapter into its base and write a Hugging Face checkpoint
(sharded safetensors, the base's config.json, the tokenizer with its chat template, and a
generation config that stops at every end token)."""

import json
import logging
from pathlib import Path

import torch

from tuneforge.export.generation import generation_config
from tuneforge.export.output import MERGED, check_output, write_atomically
from tuneforge.export.sources import ExportError, ExportSource
from tuneforge.models.api import load_model
from tuneforge.models.cost import PROJECTION_NAMES
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.checkpoint import read_hf_config, save_hf_model
from tuneforge.peft.adapter_io import load_adapter
from tuneforge.peft.apply import merge_lora

DEFAULT_SHARD_BYTES = 5 * 2**30

log = logging.getLogger(__name__)


def load_merged(source: ExportSource, dtype: str | None = None) -> Decoder:
    """The base with the adapter folded in (in fp32, then cast to the weights' dtype); for a
    QLoRA run, into its base's 4-bit values, dequantised."""
    model = load_model(source.base, dtype=dtype)
    if source.quantized is not None and source.adapter is not None:
        as_trained(model, *source.quantized)
    if source.adapter is not None:
        load_adapter(model, source.adapter, dtype=torch.float32)
        merge_lora(model)
    return model


def load_tokenizer(source: ExportSource):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source.tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as error:
        raise ExportError(f"cannot load the tokenizer in {source.tokenizer_dir}: {error}") from None


def export_merged(
    source: ExportSource,
    out: Path,
    dtype: str | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    check_output(out, overwrite, source.inputs, MERGED)  # before the minutes of loading
    model = load_merged(source, dtype)
    tokenizer = load_tokenizer(source)
    base_config = read_hf_config(source.base)

    def write(partial: Path) -> None:
        save_hf_model(model, partial, dtype, max_shard_bytes)
        # the base's own config, so that bos/eos ids and every other field survive
        written = json.loads((partial / "config.json").read_text())
        config = base_config | {"torch_dtype": written["torch_dtype"]}
        if "dtype" in base_config:
            config["dtype"] = written["torch_dtype"]
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tokenizer.save_pretrained(str(partial))
        generation = generation_config(source.base, tokenizer, base_config)
        (partial / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")

    return write_atomically(out, write, overwrite, source.inputs, MERGED)


@torch.no_grad()
def as_trained(model: Decoder, quant_type: str, double_quant: bool) -> None:
    """Every projection of the decoder blocks rounded through the 4 bits the run held it in:
    the base its adapter learned on."""
    from tuneforge.precision.bnb4bit import round_through_4bit

    changed = total = 0.0
    for name, module in model.layers.named_modules():
        if name.rsplit(".", 1)[-1] in PROJECTION_NAMES and isinstance(module, torch.nn.Linear):
            rounded = round_through_4bit(module.weight, quant_type, double_quant)
            changed += (rounded.float() - module.weight.float()).abs().sum().item()
            total += module.weight.float().abs().sum().item()
            module.weight.copy_(rounded)
    log.warning(
        "the run trained on a %s base: the adapter is merged into those 4-bit values, "
        "dequantised (they differ from the original weights by %.1f%% of their magnitude, "
        "which is what the run learned on; the adapter on the original base is not quite the "
        "trained model)", quant_type.upper(), 100 * changed / max(total, 1e-12),
    )  # fmt: skip
