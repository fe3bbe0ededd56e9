"""`export merge` against peft + transformers, and `export gguf` read back with gguf's reader."""

import json
import os
import shutil
import stat
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import tuneforge
from tests.helpers import save_tiny_model
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.errors import TuneforgeError
from tuneforge.export.gguf_file import export_gguf
from tuneforge.export.merge import export_merged
from tuneforge.export.sources import ExportError, resolve_source
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.apply import lora_modules

VOCAB = len(AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR))
TOKENS = torch.randint(0, VOCAB, (17,), generator=torch.Generator().manual_seed(4))


def make_base(directory, family="llama", **overrides):
    """A tiny random model with the demo tokenizer; its config says eos is <|endoftext|>."""
    model = save_tiny_model(directory, family, vocab_size=VOCAB, eos_token_id=0, **overrides)
    for file in DEMO_TOKENIZER_DIR.iterdir():
        shutil.copy(file, directory / file.name)
    return model


def make_adapter(base, out, targets=("q_proj", "k_proj", "v_proj", "down_proj"), seed=0):
    model = load_hf_model(base, "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": list(targets), "rank": 4, "alpha": 8})
    generator = torch.Generator().manual_seed(seed)
    for module in lora_modules(model).values():
        with torch.no_grad():
            module.lora_B.normal_(0, 0.2, generator=generator)
    tuneforge.save_adapter(model, out, str(base))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out))
    return model


def hf_logits(model):
    with torch.no_grad():
        return model(TOKENS[None]).logits[0].float()


def test_merge_equals_base_plus_adapter_in_peft(tmp_path):
    hf_base = make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "adapter")
    expected = hf_logits(PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval())
    source = resolve_source(base=tmp_path / "base", adapter=tmp_path / "adapter")
    export_merged(source, tmp_path / "merged", "float32", max_shard_bytes=40_000)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(hf_logits(merged), expected, atol=1e-5, rtol=1e-4)
    index = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert (
        tokenizer.chat_template == AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR).chat_template
    )
    generation = json.loads((tmp_path / "merged" / "generation_config.json").read_text())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation["eos_token_id"] == [0, im_end]  # the config's eos and the end of a turn
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["eos_token_id"] == 0 and config["torch_dtype"] == "float32"


def test_bf16_merge_stays_within_bf16_tolerance(tmp_path):
    hf_base = make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "adapter")
    expected = hf_logits(PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval())
    export_merged(resolve_source(tmp_path / "adapter"), tmp_path / "merged", "bfloat16")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.dtype == torch.bfloat16
    torch.testing.assert_close(hf_logits(merged), expected, atol=3e-2, rtol=3e-2)


def test_a_run_directory_stands_for_base_and_adapter(tmp_path):
    make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "run" / "adapter")
    source = resolve_source(tmp_path / "run")
    assert source.base == tmp_path / "base" and source.adapter == tmp_path / "run" / "adapter"
    with pytest.raises(ExportError, match="neither a finished run"):
        resolve_source(tmp_path)


def test_existing_output_is_kept_and_a_failed_export_writes_nothing(tmp_path):
    make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "adapter")
    source = resolve_source(base=tmp_path / "base", adapter=tmp_path / "adapter")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"already exists.*--overwrite"):
        export_merged(source, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["target_modules"] = ["o_proj"]  # the weights no longer fit the config
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(TuneforgeError, match="has no place in this model"):
        export_merged(source, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "base", "out"]


def test_overwrite_replaces_only_an_earlier_export_and_never_the_inputs(tmp_path):
    """`--overwrite` replaces a directory an export wrote, and refuses the user's own directory,
    a GGUF path that is not a GGUF file, the run it exports and the base it reads."""
    make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "run" / "adapter")
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    source = resolve_source(tmp_path / "run")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"replaces only a merged model directory.*notes\.txt"):
        export_merged(source, tmp_path / "keep", overwrite=True)
    (tmp_path / "notes.gguf").write_text("mine")
    with pytest.raises(ExportError, match="not a GGUF file"):
        export_gguf(source, tmp_path / "notes.gguf", overwrite=True)
    with pytest.raises(ExportError, match="is a directory"):
        export_gguf(source, tmp_path / "keep", overwrite=True)
    for own in (tmp_path / "run", tmp_path / "run" / "adapter", tmp_path / "base", tmp_path):
        with pytest.raises(ExportError, match="is or holds the export's input"):
            export_merged(source, own, overwrite=True)
    assert (tmp_path / "keep" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "notes.gguf").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["adapter", "metrics.jsonl"]

    export_merged(source, tmp_path / "merged")
    first = (tmp_path / "merged" / "model.safetensors").read_bytes()
    export_merged(source, tmp_path / "merged", "bfloat16", overwrite=True)  # an earlier export
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() != first
    export_gguf(source, tmp_path / "model.gguf")
    export_gguf(source, tmp_path / "model.gguf", "q8_0", overwrite=True)
    assert gguf.GGUFReader(tmp_path / "model.gguf").fields["general.file_type"].contents() == 7


def test_a_failed_overwrite_leaves_the_previous_export_whole(tmp_path, monkeypatch):
    make_base(tmp_path / "base")
    make_adapter(tmp_path / "base", tmp_path / "adapter")
    source = resolve_source(base=tmp_path / "base", adapter=tmp_path / "adapter")
    export_merged(source, tmp_path / "merged")
    before = {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()}

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tuneforge.export.merge.save_hf_model", fail)
    with pytest.raises(OSError, match="No space"):
        export_merged(source, tmp_path / "merged", overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "base", "merged"]


def test_written_weights_follow_the_umask(tmp_path):
    """On a shared cluster others read the weights as they read every other file written."""
    previous = os.umask(0o022)
    try:
        make_base(tmp_path / "base")
        make_adapter(tmp_path / "base", tmp_path / "adapter")
        source = resolve_source(base=tmp_path / "base", adapter=tmp_path / "adapter")
        export_merged(source, tmp_path / "merged")
        os.umask(0o027)
        export_merged(source, tmp_path / "group", max_shard_bytes=40_000)
    finally:
        os.umask(previous)
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    for path in ("adapter/adapter_model.safetensors", "merged/model.safetensors", "merged"):
        assert modes[Path(path)] == (0o755 if path == "merged" else 0o644), path
    assert modes[Path("group")] == 0o750
    shards = [path for path in modes if path.parts[0] == "group" and path.suffix == ".safetensors"]
    assert len(shards) > 1 and all(modes[path] == 0o640 for path in shards)


LLAMA_CPP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
    "model.layers.{i}.mlp.gate.weight": "blk.{i}.ffn_gate_inp.weight",
}
GEMMA3_NORM_NAMES = {
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.post_attention_norm.weight",
    "model.layers.{i}.pre_feedforward_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.post_feedforward_layernorm.weight": "blk.{i}.post_ffw_norm.weight",
}
DEEPSEEK2_NAMES = {
    "model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight": "blk.{i}.attn_kv_a_mqa.weight",
    "model.layers.{i}.self_attn.kv_a_layernorm.weight": "blk.{i}.attn_kv_a_norm.weight",
    **{
        f"model.layers.{{i}}.mlp.shared_experts.{p}_proj.weight": f"blk.{{i}}.ffn_{p}_shexp.weight"
        for p in ("gate", "up", "down")
    },
}
EXPERT_NAMES = {
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
}


def expected_tensors(hf_model) -> dict[str, np.ndarray]:
    """llama.cpp's tensors, from the transformers model by hand (experts stacked per layer)."""
    state = {k: v.float().numpy() for k, v in hf_model.state_dict().items()}
    config = hf_model.config
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {}
    for name, value in state.items():
        parts = name.split(".")
        if "experts" in parts:  # transformers 5 keeps experts fused: gate_up [E, 2I, D], down
            i = parts[2]
            if parts[-1] == "gate_up_proj":
                gate, up = np.split(value, 2, axis=1)
                expected[f"blk.{i}.ffn_gate_exps.weight"] = gate
                expected[f"blk.{i}.ffn_up_exps.weight"] = up
            else:
                expected[f"blk.{i}.ffn_down_exps.weight"] = value
            continue
        template = ".".join("{i}" if p.isdigit() else p for p in parts)
        layer = next((p for p in parts if p.isdigit()), "")
        gemma = config.model_type == "gemma3_text"
        names = LLAMA_CPP_NAMES | (GEMMA3_NORM_NAMES if gemma else {}) | DEEPSEEK2_NAMES
        if name.endswith("kv_b_proj.weight"):  # llama.cpp's MLA: per head, keys transposed
            layer = parts[2]
            heads, nope, v_dim = (
                config.num_attention_heads,
                config.qk_nope_head_dim,
                config.v_head_dim,
            )
            per_head = value.reshape(heads, nope + v_dim, config.kv_lora_rank)
            expected[f"blk.{layer}.attn_k_b.weight"] = per_head[:, :nope].transpose(0, 2, 1)
            expected[f"blk.{layer}.attn_v_b.weight"] = per_head[:, nope:]
            continue
        if gemma and name.endswith("norm.weight"):
            value = value + 1.0  # llama.cpp's Gemma norms scale by their weight alone
        expected[names[template].replace("{i}", layer)] = value
    return expected


def rope_scores(q, k, positions, theta, interleaved):
    """Attention logits q(p)·k(p') with rotary embeddings, pairing dims as HF (rotate-half) or
    llama.cpp's `llama` kernels (interleaved) do."""
    d = q.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)

    def rotate(x, p):
        angle = p * inv
        cos, sin = np.cos(angle), np.sin(angle)
        if interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
            return out
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    return np.array([[rotate(q, p) @ rotate(k, r) for r in positions] for p in positions])


def read_back(file):
    reader = gguf.GGUFReader(file)
    tensors = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        tensors[tensor.name] = (np.asarray(data, dtype=np.float32), tensor.tensor_type)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    return tensors, fields


@pytest.mark.parametrize(
    ("family", "arch", "overrides"),
    [
        ("llama", "llama", {}),
        ("llama", "llama", {"tie_word_embeddings": True}),
        ("qwen2", "qwen2", {}),
        ("qwen3", "qwen3", {}),
        ("qwen3_moe", "qwen3moe", {}),
        ("mistral", "llama", {}),
        ("mixtral", "llama", {}),
        ("gemma3_text", "gemma3", {}),
        ("deepseek_v2", "deepseek2", {}),
    ],
)
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_gguf_holds_every_tensor_and_the_metadata(tmp_path, family, arch, overrides, kind):
    hf_model = make_base(tmp_path / "base", family, **overrides)
    export_gguf(resolve_source(tmp_path / "base"), tmp_path / "model.gguf", kind)
    tensors, fields = read_back(tmp_path / "model.gguf")
    expected = expected_tensors(hf_model)
    assert set(tensors) == set(expected)
    config = hf_model.config
    for name, want in expected.items():
        got, tensor_type = tensors[name]
        assert got.shape == want.shape, name
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            continue  # permuted for llama.cpp's rotary layout: checked below
        if tensor_type == gguf.GGMLQuantizationType.Q8_0:
            # Q8_0: per 32 values a scale d = max|x| / 127 stored in fp16, values rounded to
            # the nearest multiple: error <= d / 2, plus 127 x the scale's fp16 rounding
            blocks = want.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            bound = step * (0.5 + 127 * 2.0**-11) + 1e-7
            assert (np.abs(got.reshape(-1, 32) - blocks) <= bound).all(), name
        elif tensor_type == gguf.GGMLQuantizationType.F16:
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))
        else:
            router = ".ffn_gate_inp." in name  # kept in F32, as llama.cpp's converter keeps it
            assert (want.ndim == 1 or router) and tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(got, want)
    if arch == "llama":
        head_dim = config.hidden_size // config.num_attention_heads
        x = np.random.default_rng(0).standard_normal(config.hidden_size).astype(np.float32)
        group = config.num_attention_heads // config.num_key_value_heads
        for layer in range(config.num_hidden_layers):
            q_hf = expected[f"blk.{layer}.attn_q.weight"] @ x
            k_hf = expected[f"blk.{layer}.attn_k.weight"] @ x
            q_gg = tensors[f"blk.{layer}.attn_q.weight"][0] @ x
            k_gg = tensors[f"blk.{layer}.attn_k.weight"][0] @ x
            for head in range(config.num_attention_heads):
                kv = head // group
                q_slice, k_slice = (
                    slice(head * head_dim, (head + 1) * head_dim),
                    slice(kv * head_dim, (kv + 1) * head_dim),
                )
                hf = rope_scores(q_hf[q_slice], k_hf[k_slice], [0, 3, 11], 10000.0, False)
                ours = rope_scores(q_gg[q_slice], k_gg[k_slice], [0, 3, 11], 10000.0, True)
                np.testing.assert_allclose(ours, hf, rtol=0.05, atol=0.05 * np.abs(hf).max())
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.block_count"] == config.num_hidden_layers
    assert fields[f"{arch}.embedding_length"] == config.hidden_size
    if arch == "deepseek2":  # latent attention as one key-value head of the latent's width
        assert fields[f"{arch}.attention.head_count_kv"] == 1
        assert fields[f"{arch}.attention.kv_lora_rank"] == config.kv_lora_rank
        assert (
            fields[f"{arch}.attention.key_length"] == config.kv_lora_rank + config.qk_rope_head_dim
        )
        assert (
            fields[f"{arch}.attention.key_length_mla"]
            == config.qk_nope_head_dim + config.qk_rope_head_dim
        )
        assert fields[f"{arch}.attention.value_length_mla"] == config.v_head_dim
        assert fields[f"{arch}.leading_dense_block_count"] == config.first_k_dense_replace
        assert fields[f"{arch}.expert_shared_count"] == config.n_shared_experts
        assert fields[f"{arch}.expert_weights_scale"] == pytest.approx(config.routed_scaling_factor)
        assert fields[f"{arch}.rope.scaling.type"] == "yarn"
    else:
        assert fields[f"{arch}.attention.head_count_kv"] == config.num_key_value_heads
    assert fields[f"{arch}.context_length"] == config.max_position_embeddings
    if family in ("qwen3_moe", "mixtral", "deepseek_v2"):
        assert fields[f"{arch}.expert_count"] == 8 and fields[f"{arch}.expert_used_count"] == 2
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    assert fields["tokenizer.ggml.tokens"] == [by_id[i] for i in range(VOCAB)]
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.merges"]
    assert fields["tokenizer.chat_template"] == tokenizer.chat_template
    assert fields["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert fields["tokenizer.ggml.eot_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fields["tokenizer.ggml.token_type"][:3] == [gguf.TokenType.CONTROL] * 3


def test_llama3_rope_scaling_becomes_rope_freqs(tmp_path):
    make_base(tmp_path / "base", "llama3_rope")
    export_gguf(resolve_source(tmp_path / "base"), tmp_path / "model.gguf")
    tensors, _ = read_back(tmp_path / "model.gguf")
    factors, _ = tensors["rope_freqs.weight"]
    # the reference recipe, written out: frequencies below the low-frequency wavelength are
    # divided by factor, above the high one kept, in between smoothly interpolated
    head_dim, theta, factor, low, high, original = 16, 500000.0, 8.0, 1.0, 4.0, 32
    expected = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            expected.append(1.0)
        elif wavelen > original / low:
            expected.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            expected.append(1 / ((1 - smooth) / factor + smooth))
    np.testing.assert_allclose(factors, expected, rtol=1e-5)


def test_a_sentencepiece_style_tokenizer_is_refused_before_anything_is_written(tmp_path):
    """Llama 2, Mistral and Gemma ship BPE with byte fallback behind a Metaspace pre-tokenizer:
    llama.cpp reads those as SentencePiece vocabularies, not as byte-level BPE."""

    make_base(tmp_path / "base", "mistral")
    spec = json.loads((tmp_path / "base" / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
    spec["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
    (tmp_path / "base" / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ExportError, match=r"SentencePiece-style BPE.*convert_hf_to_gguf"):
        export_gguf(resolve_source(tmp_path / "base"), tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_k_quants_need_llama_cpp_and_say_so_without_writing(tmp_path, monkeypatch):
    import sys

    make_base(tmp_path / "base")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(
        ExportError, match=r"q4_k_m is quantised by llama\.cpp.*tuneforge\[llamacpp\]"
    ):
        export_gguf(resolve_source(tmp_path / "base"), tmp_path / "model.gguf", "q4_k_m")
    assert not (tmp_path / "model.gguf").exists() and list(tmp_path.iterdir()) == [
        tmp_path / "base"
    ]


@pytest.mark.parametrize(("kind", "file_type", "error"), [("q4_k_m", 15, 0.12), ("q6_k", 18, 0.03)])
def test_k_quants_are_llama_cpps_own(tmp_path, kind, file_type, error):
    """The file llama.cpp quantised: its type, the F16 file's tensors, each within the format's
    rounding of the F16 values (read back with gguf's dequantisation)."""
    pytest.importorskip("llama_cpp", reason="k-quants are written by llama.cpp (llama-cpp-python)")
    make_base(tmp_path / "base", intermediate_size=256)
    export_gguf(resolve_source(tmp_path / "base"), tmp_path / "model.gguf", kind)
    export_gguf(resolve_source(tmp_path / "base"), tmp_path / "f16.gguf", "f16")
    quantised, fields = read_back(tmp_path / "model.gguf")
    exact, _ = read_back(tmp_path / "f16.gguf")
    assert fields["general.file_type"] == file_type and set(quantised) == set(exact)
    for name, (values, _) in exact.items():
        got = quantised[name][0].reshape(values.shape)
        assert np.linalg.norm(got - values) <= error * np.linalg.norm(values), name
