"""The public entry points: `load_model` and `save_model`."""

import shutil
from pathlib import Path

import torch

from tuneforge.models.args import ModelArgs
from tuneforge.models.attention import resolve_backend
from tuneforge.models.catalog import CATALOG, catalog_shape
from tuneforge.models.decoder import Decoder
from tuneforge.models.errors import ModelError, ModelNotFoundError
from tuneforge.models.hf.checkpoint import (
    DTYPES,
    args_from_dir,
    load_hf_model,
    read_hf_config,
    save_hf_model,
)
from tuneforge.models.meta import on_meta

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


def load_model(
    path_or_shape: str | Path,
    *,
    num_layers: int | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    attention: str = "auto",
    seed: int = 0,
    init_std: float = 0.02,
    draw_on: str | torch.device | None = None,
) -> Decoder:
    """A local Hugging Face model directory, or a catalog shape (`tuneforge models`) with seeded
    random weights (normal, `init_std`). `dtype` defaults to the checkpoint's own (bfloat16 for
    catalog shapes). The attention backend that runs is `model.attention_backend`. `draw_on`:
    where a catalog shape's random values are drawn (default: `device`); the same seed gives the
    same weights wherever they are then held."""
    target = torch.device(device) if device is not None else torch.device("cpu")
    if attention != "auto":
        resolve_backend(attention, target)  # one that cannot run here fails before loading
    dtype_name = _dtype_name(dtype)
    backend = "sdpa"  # until the dtype and head size are known
    path = Path(path_or_shape)
    if path.is_dir():
        hf_config = read_hf_config(path)
        checkpoint_dtype = hf_config.get("dtype") or hf_config.get("torch_dtype")
        model = load_hf_model(path, dtype_name or _known(checkpoint_dtype), backend, num_layers)
        model.source_dir = path
    elif str(path_or_shape) in CATALOG:
        args = model_args(path_or_shape, num_layers)
        with on_meta():
            model = Decoder(args, backend)
        model.to(DTYPES[dtype_name or "bfloat16"]).to_empty(device=target)
        model.tie_weights()
        if target.type != "meta":
            drawn = torch.device(draw_on) if draw_on is not None else target
            model.init_weights(init_std, torch.Generator(device=drawn).manual_seed(seed))
    else:
        raise ModelNotFoundError(
            f"{path_or_shape} is neither a model directory nor a catalog shape ({', '.join(CATALOG)})"
        )
    model.set_attention_backend(
        resolve_backend(
            attention,
            target,
            model.embed.weight.dtype,
            model.args.head_dim,
            model.args.plain_attention,
        )
    )
    return model.to(target)


def model_args(path_or_shape: str | Path, num_layers: int | None = None) -> ModelArgs:
    """The shape of a local Hugging Face model directory or of a catalog shape, with its first
    `num_layers` layers only if given."""
    if Path(path_or_shape).is_dir():
        return args_from_dir(Path(path_or_shape), num_layers)
    return catalog_shape(str(path_or_shape)).with_layers(num_layers)


def save_model(model: Decoder, out_dir: str | Path, dtype: str | torch.dtype | None = None) -> Path:
    """Write the model in the Hugging Face layout (config.json, sharded safetensors with an index),
    with the tokenizer files of the directory it was loaded from."""
    out = Path(out_dir)
    save_hf_model(model, out, _dtype_name(dtype))
    source = getattr(model, "source_dir", None)
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source / name).is_file() and source.resolve() != out.resolve():
                shutil.copy2(source / name, out / name)
    return out


def _dtype_name(dtype: str | torch.dtype | None) -> str | None:
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(name, name)
    if name not in DTYPES:
        raise ModelError(f"dtype {dtype} is not one of {', '.join(DTYPES)}")
    return name


def _known(name: str | None) -> str:
    return name if name in DTYPES else "bfloat16"
