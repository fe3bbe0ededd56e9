"""Build the pieces of a run from its configuration: device, tokenizer, model, data."""

import logging
from pathlib import Path
from typing import NamedTuple

import torch

from tuneforge.config.objectives.registry import declaration_of
from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.model import ModelSection
from tuneforge.data.templates import resolve_template
from tuneforge.data.training_data import TrainingData, load_training_data
from tuneforge.errors import TuneforgeError
from tuneforge.models.api import load_model
from tuneforge.models.attention import resolve_backend
from tuneforge.models.decoder import Decoder
from tuneforge.models.errors import ModelError
from tuneforge.parallel.distributed import Dist, barrier, configured_dims
from tuneforge.precision.bnb4bit import quantize_on_arrival
from tuneforge.precision.converters import ArrivedFourBit

log = logging.getLogger(__name__)


def load_tokenizer(config: RunConfig):
    from transformers import AutoTokenizer

    path = config.tokenizer.path or config.model.path
    assert path is not None  # guaranteed by the config rules
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, ImportError) as error:
        directory = Path(path)
        if directory.is_dir() and not (directory / "tokenizer.json").is_file():
            raise TuneforgeError(
                f"{directory} has no tokenizer.json (the tokenizer file Hugging Face models "
                "ship): copy it from the model's repository, or set tokenizer.path to a "
                "directory that holds it"
            ) from None
        raise TuneforgeError(f"cannot load a tokenizer from {path}: {error}") from None
    if config.tokenizer.chat_template is not None:
        tokenizer.chat_template = resolve_template(config.tokenizer.chat_template)
    if not tokenizer.chat_template:
        raise TuneforgeError(
            f"the tokenizer in {path} has no chat template: set tokenizer.chat_template in the config"
        )
    return tokenizer


class BuiltModel(NamedTuple):
    model: Decoder
    arrived: ArrivedFourBit | None = None
    """A model directory whose base is held in 4 bits (`quantize`): the projections quantised
    on their way to the device, which the precision step swaps in."""


def build_model(section: ModelSection, device: torch.device, seed: int) -> BuiltModel:
    """Load a local HF model, or build a catalog shape with seeded random weights. A base held
    in 4 bits (`quantize`) is read, or made (its values drawn on `device` a weight at a time),
    in host memory and each projection quantised on its way to `device`: the GPU never holds
    the base in `dtype`."""
    source = section.path if section.path is not None else section.name
    assert source is not None  # guaranteed by the config rules
    staged = section.quantize is not None
    try:
        model = load_model(
            source,
            num_layers=section.num_layers,
            dtype=section.dtype,
            device="cpu" if staged else device,
            attention="auto" if staged else section.attention,
            seed=seed,
            init_std=section.init_std,
            draw_on=device,
        )
    except ModelError as error:  # say which section the problem is in
        raise type(error)(f"model: {error}") from None
    arrived = None
    if staged:
        assert section.quantize is not None
        arrived = quantize_on_arrival(model, section.quantize, section.double_quant, device)
        model.to(device)
        args = model.args
        dtype = model.embed.weight.dtype
        plain = args.plain_attention
        backend = resolve_backend(section.attention, device, dtype, args.head_dim, plain)
        model.set_attention_backend(backend)
    backend = model.attention_backend
    log.info("attention backend: %s", backend)
    if backend == "eager":
        log.warning(
            "eager attention materialises seq x seq scores per head: slow and memory-hungry at long sequences"
        )
    return BuiltModel(model, arrived)


def read_training_data(
    config: RunConfig, tokenizer, rank: int = 0, world_size: int = 1
) -> TrainingData:
    """The training data data-parallel rank `rank` of `world_size` reads, as the objective
    reads it (pairs, unpaired records or conversations)."""
    return load_training_data(
        config.data,
        tokenizer,
        config.train.tokens_per_micro_batch,
        config.train.seed,
        rank=rank,
        world_size=world_size,
        data_format=declaration_of(config).data_format,
        keep_fields=declaration_of(config).keeps_record_fields,
    )


def load_data(config: RunConfig, tokenizer, world: Dist) -> TrainingData:
    """This rank's training data; the first rank tokenises into the cache, then the others read
    it. A data problem is a `TuneforgeError` on every rank."""

    dims = configured_dims(config.parallel, world)  # tensor-parallel ranks read the same data

    def load() -> TrainingData:
        return read_training_data(
            config, tokenizer, dims.data_rank(world.rank), dims.data_parallel_size
        )

    data, problem = None, None
    if world.is_main:
        try:
            data = load()
        except TuneforgeError as error:
            problem = error
    barrier()
    if data is None and problem is None:
        try:
            data = load()
        except TuneforgeError as error:
            problem = error
    if problem is not None:
        raise problem
    assert data is not None
    return data
