"""`tuneforge export gguf`: a GGUF file llama.cpp runs, written with the `gguf` package.

Tensor names come from gguf's own HF-to-GGUF name map; metadata keys are llama.cpp's for the
`llama` (Llama, Mistral, Mixtral), `qwen2`, `qwen3`, `qwen3moe`, `gemma3` and `deepseek2`
architectures, with what its converter rewrites per family (`gguf_families.py`). As llama.cpp's converter does, Llama's
q/k projections are permuted from Hugging Face's rotate-half rotary layout to the interleaved
one its `llama` kernels expect, and Llama 3 rope scaling becomes a `rope_freqs` tensor. The
tokenizer is embedded: tokens, token types, merges, special ids, the end-of-turn id and the chat
template.
"""

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from tuneforge.export.gguf_families import (
    ARCHITECTURES,
    GEMMA3_LOCAL_PATTERN,
    add_family_metadata,
    rewritten,
)
from tuneforge.export.gguf_quantize import LLAMA_CPP_TYPES, quantize_with_llama_cpp
from tuneforge.export.gguf_tokenizer import add_tokenizer, pre_tokenizer_name, read_byte_level_bpe
from tuneforge.export.merge import load_merged, load_tokenizer
from tuneforge.export.output import GGUF, check_output, write_atomically
from tuneforge.export.sources import ExportError, ExportSource
from tuneforge.models.args import ModelArgs, RopeScaling
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.rope import inverse_frequencies

log = logging.getLogger(__name__)

TYPES = ("f16", "q8_0", *LLAMA_CPP_TYPES)


def hf_tensors(model: Decoder) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every weight; stacked experts keep their [E, out, in] stack under
    the bank's name (`...mlp.experts.gate_proj.weight`), as gguf's name map expects; the stacked
    gate and up (`gate_up_proj`) go out as two such stacks."""
    args = model.args
    family = adapter_for(args.family)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and args.tie_embeddings:
            continue
        if ".mlp.experts." in name:
            for half in family.halves(name):
                hf_name = family.to_hf(name, 0, half)
                assert hf_name is not None
                part = tensor if half is None else tensor.chunk(2, dim=1)[half]
                yield hf_name.replace(".experts.0.", ".experts."), part
            continue
        hf_name = family.to_hf(name)
        if hf_name is None:
            raise ExportError(f"no Hugging Face name for {name}")
        yield from rewritten(args, hf_name, tensor)


def rope_factors(args: ModelArgs) -> np.ndarray | None:
    """Llama 3 rope scaling as llama.cpp reads it: the divisor of each rotary frequency."""
    if not isinstance(args.rope_scaling, RopeScaling):  # linear scaling is metadata
        return None
    plain = inverse_frequencies(args.head_dim, args.rope_theta, None)
    scaled = inverse_frequencies(args.head_dim, args.rope_theta, args.rope_scaling)
    return (plain / scaled).numpy().astype(np.float32)


def encode(array: np.ndarray, kind: str):
    """(data, raw dtype or None) in the GGUF type (`f32`, `f16`, `q8_0`): vectors stay F32,
    matrices F16 or Q8_0 (F16 where a row does not split into Q8_0 blocks)."""
    import gguf

    if array.ndim < 2 or kind == "f32":
        return array.astype(np.float32), None
    if kind == "q8_0":
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
        if array.shape[-1] % block == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            return gguf.quants.quantize(array.astype(np.float32), q8), q8
    return array.astype(np.float16), None


def add_architecture(writer, args: ModelArgs, name: str, kind: str) -> None:
    import gguf

    writer.add_name(name)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.dim)
    writer.add_block_count(args.num_layers)
    writer.add_feed_forward_length(args.ffn_dim)
    writer.add_head_count(args.num_heads)
    if args.latent_attention is None:  # latent attention's are its own (`gguf_families.py`)
        writer.add_head_count_kv(args.num_kv_heads)
        writer.add_key_length(args.head_dim)
        writer.add_value_length(args.head_dim)
        writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    add_family_metadata(writer, args)
    if args.moe is not None:
        writer.add_expert_count(args.moe.num_experts)
        writer.add_expert_used_count(args.moe.top_k)
        writer.add_expert_feed_forward_length(args.moe.expert_ffn_dim)
    file_type = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    writer.add_file_type(file_type[kind])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def export_gguf(
    source: ExportSource, out: Path, kind: str = "f16", overwrite: bool = False
) -> Path:
    try:
        import gguf
    except ImportError:
        raise ExportError(
            'GGUF export needs the gguf package: pip install "tuneforge[gguf]"'
        ) from None
    if kind not in TYPES:
        raise ExportError(f"--type {kind}: use one of {', '.join(TYPES)}")
    check_output(out, overwrite, source.inputs, GGUF)
    # before the minutes of loading: a tokenizer llama.cpp would not split as training did
    pre_tokenizer_name(read_byte_level_bpe(source.tokenizer_dir), source.tokenizer_dir)
    model = load_merged(source)
    args = model.args
    if args.family not in ARCHITECTURES:
        raise ExportError(f"GGUF export does not know the {args.family} architecture")
    tokenizer = load_tokenizer(source)
    arch = ARCHITECTURES[args.family]
    if args.gemma is not None:
        pattern = tuple(
            "full_attention" if (i + 1) % GEMMA3_LOCAL_PATTERN == 0 else "sliding_attention"
            for i in range(args.num_layers)
        )
        if args.gemma.layer_types[: args.num_layers] != pattern:
            log.warning(
                "llama.cpp's gemma3 takes every %dth layer as global; this model's layers "
                "differ (%s): the GGUF file will not run as trained",
                GEMMA3_LOCAL_PATTERN, ", ".join(args.gemma.layer_types[: args.num_layers]),
            )  # fmt: skip
    elif args.windowed:
        log.warning(
            "the model's sliding window (%s tokens) is not in the GGUF file: llama.cpp's %s "
            "architecture attends to the whole context, the same only up to the window",
            args.sliding_window, arch,
        )  # fmt: skip
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], args.num_layers)

    written = "f16" if kind in LLAMA_CPP_TYPES else kind  # llama.cpp quantises from F16

    def write(partial: Path) -> None:
        target = partial.with_suffix(".f16.gguf") if written != kind else partial
        write_file(target)
        if target != partial:
            quantize_with_llama_cpp(target, partial, kind)

    def write_file(partial: Path) -> None:
        writer = gguf.GGUFWriter(str(partial), arch)
        add_architecture(writer, args, source.base.name, written)
        add_tokenizer(writer, tokenizer, source.tokenizer_dir, args.vocab_size)
        factors = rope_factors(args)
        if factors is not None:
            writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)
        for hf_name, tensor in hf_tensors(model):
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ExportError(f"gguf has no name for {hf_name} in the {arch} architecture")
            # routers stay in F32 in every file type, as llama.cpp's converter and quantiser keep them
            router = ".ffn_gate_inp" in gguf_name
            data, raw_dtype = encode(tensor.float().numpy(), "f32" if router else written)
            writer.add_tensor(gguf_name, data, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return write_atomically(out, write, overwrite, source.inputs, GGUF)
