"""Read and write models in the Hugging Face layout: config.json + (sharded) *.safetensors."""

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.tensor import DTensor, Replicate

from tuneforge.file_modes import save_tensors
from tuneforge.models.args import ModelArgs
from tuneforge.models.decoder import Decoder
from tuneforge.models.errors import ModelError
from tuneforge.models.hf.adapter import Place, adapter_for
from tuneforge.models.meta import on_meta
from tuneforge.models.score_head import (
    SCORE_WEIGHT,
    ScoreHead,
    score_head_of,
    scorer_config,
)
from tuneforge.sequence_classifier import is_sequence_classifier

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
LAYER_INDEX = re.compile(r"^layers\.(\d+)\.")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(ModelError):
    """A model directory that cannot be read as a Hugging Face checkpoint."""


def read_hf_config(model_dir: Path) -> dict[str, Any]:
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{model_dir} has no config.json: point model.path at a Hugging Face model directory"
        )
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"{config_file}: invalid JSON at line {error.lineno}: {error.msg}"
        ) from None


def args_from_dir(model_dir: Path, num_layers: int | None = None) -> ModelArgs:
    """The shape of the model in a Hugging Face directory (its `config.json`)."""
    config = read_hf_config(model_dir)
    try:
        adapter = adapter_for(config.get("model_type", ""))
    except ModelError as error:
        raise CheckpointError(f"{model_dir / 'config.json'}: {error}") from None
    return adapter.args_from_config(config).with_layers(num_layers)


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise CheckpointError(
            f"{model_dir} has no *.safetensors weights (pickled .bin files are not read)"
        )
    return found


def load_hf_model(
    model_dir: Path, dtype: str = "bfloat16", attention: str = "sdpa", num_layers: int | None = None
) -> Decoder:
    """Build our decoder from a HF directory, streaming tensors one at a time (no 2x host peak)."""
    args = args_from_dir(model_dir, num_layers)
    adapter = adapter_for(args.family)
    with on_meta():
        model = Decoder(args, attention)
    model.to_empty(device="cpu")
    model.tie_weights()
    model.to(DTYPES[dtype])
    config = read_hf_config(model_dir)
    scorer = is_sequence_classifier(config)
    if scorer:  # a reward model: the score head in place of the output layer
        model.score = ScoreHead(args.dim, config.get("pad_token_id"), DTYPES[dtype])
    params = dict(model.named_parameters(remove_duplicate=False))
    expected = set(params) - ({"lm_head.weight"} if args.tie_embeddings or scorer else set())
    loaded: set[str] = set()
    unexpected: list[str] = []
    experts_loaded: dict[str, set[tuple[int, int | None]]] = {}
    for file in safetensors_files(model_dir):
        try:
            handle_context = safe_open(str(file), framework="pt")
        except Exception as error:  # safetensors raises its own error types for damaged files
            raise CheckpointError(f"{file}: not a readable safetensors file ({error})") from None
        with handle_context as handle:
            for hf_name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                translated = (
                    Place(SCORE_WEIGHT)
                    if scorer and hf_name == SCORE_WEIGHT
                    else adapter.from_hf(hf_name)
                )
                if translated is None:
                    unexpected.append(hf_name)
                    continue
                name = translated.name
                layer = LAYER_INDEX.match(name)
                if layer and int(layer.group(1)) >= args.num_layers:
                    continue
                if name == "lm_head.weight" and args.tie_embeddings:
                    continue
                if name not in params:
                    unexpected.append(hf_name)
                    continue
                tensor = handle.get_tensor(hf_name)
                target = translated.of(params[name])
                if not tensor.is_floating_point():
                    raise CheckpointError(
                        f"{file.name}: {hf_name} is stored as {tensor.dtype}, not as floating "
                        "point: a quantized or damaged checkpoint cannot be loaded as weights "
                        "(use the unquantized model)"
                    )
                if tensor.shape != target.shape:
                    raise CheckpointError(
                        f"{file.name}: {hf_name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                    )
                with torch.no_grad():
                    target.copy_(tensor)
                if translated.expert is None:
                    loaded.add(name)
                else:
                    parts = experts_loaded.setdefault(name, set())
                    parts.add((translated.expert, translated.half))
    for name, parts in experts_loaded.items():
        if len(parts) == params[name].shape[0] * len(adapter.halves(name)):
            loaded.add(name)
    missing = sorted(expected - loaded)
    if missing or unexpected:
        raise CheckpointError(
            f"{model_dir}: weights do not match the {args.family} layout; "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
        )
    log.info("loaded %d tensors from %s", len(loaded), model_dir)
    return model


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded (FSDP2 DTensor) one, as a plain tensor; every rank must
    call it. One mesh dimension at a time, outermost first (FSDP2's shard of a tensor-parallel
    shard, then that shard): each step one all-gather, where a single redistribution of
    several dimensions is several sequential ones that torch warns of."""
    whole = tensor
    if isinstance(tensor, DTensor):
        placements = list(tensor.placements)
        sharded = tensor
        for dim, placement in enumerate(placements):
            if not placement.is_replicate():
                placements[dim] = Replicate()
                sharded = sharded.redistribute(placements=placements)
        whole = sharded.to_local()
    inner = getattr(whole, "_tensor", None)
    # torchao's float8 training wraps a weight gathered in FP8 around its bf16 value
    return inner if type(whole) is not torch.Tensor and isinstance(inner, torch.Tensor) else whole


def save_hf_model(
    model: Decoder,
    out_dir: Path,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
    write: bool = True,
    state: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> None:
    """Write config.json and safetensors shards (with an index when there is more than one).
    Under FSDP every rank calls it (to gather the shards) and one writes (`write`). `state`:
    the weights to write by our names, as (name, tensor) pairs (default: the model's state
    dict). A model with a score head is written as a one-label sequence classifier (a reward
    model), without its output layer."""
    args = model.args
    adapter = adapter_for(args.family)
    head = score_head_of(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items() if state is None else state:
        if name == "lm_head.weight" and (args.tie_embeddings or head is not None):
            continue
        tensor = gathered(tensor.detach())
        if not write:
            continue
        tensor = tensor.to(DTYPES[dtype] if dtype else tensor.dtype).cpu()
        if name == SCORE_WEIGHT:
            tensors[name] = tensor.contiguous()
            continue
        stacked = ".mlp.experts." in name
        for expert, part in enumerate(tensor.unbind(0) if stacked else [tensor]):
            for half in adapter.halves(name):
                hf_name = adapter.to_hf(name, expert if stacked else None, half)
                if hf_name is None:
                    raise KeyError(f"no Hugging Face name for {name}")
                piece = part if half is None else part.chunk(2, dim=0)[half]
                tensors[hf_name] = piece.contiguous()
    if not write:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype_name = dtype or str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    shards = _shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_tensors(shards[0], out_dir / SINGLE_FILE, metadata={"format": "pt"})
    else:
        weight_map = {}
        for number, shard in enumerate(shards, start=1):
            name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            save_tensors(shard, out_dir / name, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    config = adapter.config_from_args(args, dtype_name)
    if head is not None:
        config = scorer_config(config, head.pad_token_id)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))


def _shard(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
