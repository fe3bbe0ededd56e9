"""`tuneforge.load_model` / `save_model`, and clear errors for bad checkpoints."""

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

import tuneforge
from tests.helpers import save_tiny_model
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.models.hf.checkpoint import CheckpointError


def test_batch_and_packed_inputs_agree(tmp_path):
    save_tiny_model(tmp_path, "qwen3")
    model = tuneforge.load_model(tmp_path, dtype="float32")
    ids = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(0))
    batch_logits = model(ids)
    assert batch_logits.shape == (3, 9, 128)
    flat = model(
        ids.reshape(-1),
        cu_seqlens=torch.tensor([0, 9, 18, 27]),
        position_ids=torch.arange(9).repeat(3),
    )
    torch.testing.assert_close(flat.view(3, 9, -1), batch_logits)


def test_save_model_keeps_tokenizer_files_and_transformers_loads_it(tmp_path):
    hf_model = save_tiny_model(tmp_path / "src", "llama", vocab_size=384)
    AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR).save_pretrained(tmp_path / "src")
    model = tuneforge.load_model(tmp_path / "src", dtype="float32")
    tuneforge.save_model(model, tmp_path / "out")
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 384, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, hf_model(ids).logits)


def test_catalog_shape_proxy_with_cut_depth():
    model = tuneforge.load_model("llama-2-70b", num_layers=1, dtype="float32", device="meta")
    assert len(model.layers) == 1 and model.args.dim == 8192


def test_unknown_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a model directory nor a catalog shape"):
        tuneforge.load_model(tmp_path / "nothing")


def test_wrong_shape_names_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    save_tiny_model(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(3, 64\)"
    ):
        tuneforge.load_model(tmp_path)


def test_integer_weights_are_refused_not_cast(tmp_path):
    from safetensors.torch import load_file, save_file

    save_tiny_model(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name].to(torch.int32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"{name} is stored as torch.int32, not as floating"):
        tuneforge.load_model(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    save_tiny_model(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing \['layers\.1\.mlp\.up_proj\.weight'\]"):
        tuneforge.load_model(tmp_path)


def test_one_missing_expert_half_names_the_stacked_bank(tmp_path):
    """Gate and up are two tensors per expert on disk and one stacked parameter in memory: a
    missing up tensor of one expert leaves that bank incomplete."""
    from safetensors.torch import load_file, save_file

    save_tiny_model(tmp_path, "qwen3_moe")
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.mlp.experts.2.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"missing \['layers\.0\.mlp\.experts\.gate_up_proj'\]"
    ):
        tuneforge.load_model(tmp_path)


def test_unknown_model_type_is_named(tmp_path):
    save_tiny_model(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "gpt_neox"}))
    with pytest.raises(CheckpointError, match=r"model_type 'gpt_neox' is not supported"):
        tuneforge.load_model(tmp_path)


def test_truncated_safetensors_file_is_named(tmp_path):
    save_tiny_model(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        tuneforge.load_model(tmp_path)


def test_flash4_attention_asked_for_where_it_cannot_run_is_a_clear_error():
    with pytest.raises(ValueError, match=r"flash-attn-4.*model\.attention"):
        tuneforge.load_model("demo-tiny", attention="flash4")


def test_flash4_operators_report_their_output_shapes_without_running():
    """What a compiled graph sees of the kernels: outputs shaped like q and the log-sum-exp
    [heads, tokens] in fp32; gradients shaped like q, k and v (GQA: k and v have fewer heads)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneforge.models import flash4

    with FakeTensorMode():
        q = torch.empty(700, 8, 128, dtype=torch.bfloat16)
        k = v = torch.empty(700, 2, 128, dtype=torch.bfloat16)
        cu = torch.tensor([0, 300, 700], dtype=torch.int32)
        out, lse = flash4.flash4_forward(q, k, v, cu, 400)
        dq, dk, dv = flash4.flash4_backward(out, q, k, v, out, lse, cu, 400)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (8, 700) and lse.dtype == torch.float32
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_auto_attention_picks_by_dtype_and_head_size(monkeypatch):
    """On a GPU where both flash backends run: bf16 with a head size the kernels take gets
    FlashAttention-4, float32 (which no flash kernel takes) gets SDPA over padded length classes, a head size
    over 256 too."""
    from tuneforge.models import attention, flash4

    monkeypatch.setattr(flash4, "available", lambda device: True)
    monkeypatch.setattr(flash4, "supports", lambda head_dim, device: head_dim <= 256)
    monkeypatch.setattr(attention, "varlen_available", lambda device: True)
    gpu = torch.device("cuda")
    assert attention.resolve_backend("auto", gpu, torch.bfloat16, 128) == "flash4"
    assert attention.resolve_backend("auto", gpu, torch.float32, 128) == "sdpa_padded"
    assert attention.resolve_backend("auto", gpu, torch.bfloat16, 512) == "sdpa_padded"
    monkeypatch.setattr(flash4, "supports", lambda head_dim, device: head_dim <= 128)
    assert attention.resolve_backend("auto", gpu, torch.float16, 256) == "varlen"
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention.resolve_backend("flash4", gpu, torch.float32, 128)
    with pytest.raises(ValueError, match="cuDNN"):
        attention.resolve_backend("cudnn", torch.device("cpu"))
    with pytest.raises(ValueError, match="sliding window"):
        attention.resolve_backend("cudnn", gpu, plain=False)
    assert attention.resolve_backend("cudnn", gpu) == "cudnn"


def test_cudnn_attention_falls_back_where_cudnn_refuses():
    """cuDNN takes no one-token document; SDPA's other kernels compute it (here on the CPU,
    where cuDNN is absent altogether)."""
    from tuneforge.models import attention
    from tuneforge.packed import PackedSequences

    packed = PackedSequences.from_lengths([5, 1, 7], torch.device("cpu"))
    q, k, v = torch.randn(13, 4, 16), torch.randn(13, 2, 16), torch.randn(13, 2, 16)
    expected = attention.sdpa_attention(q, k, v, packed)
    torch.testing.assert_close(attention.cudnn_attention(q, k, v, packed), expected)
    torch.testing.assert_close(expected[5], v[5].repeat_interleave(2, dim=0))


@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_over_padded_length_classes_matches_the_explicit_softmax(window):
    """Documents of 1 to 11 tokens in three length classes, GQA and a narrower v (latent
    attention's shape): outputs and gradients as `eager` computes them per document."""
    from tuneforge.models import attention
    from tuneforge.packed import PackedSequences

    lengths = [5, 1, 7, 11, 2, 8]
    packed = PackedSequences.from_lengths(lengths, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    shapes = [(34, 4, 16), (34, 2, 16), (34, 2, 12)]
    inputs = [torch.randn(*shape, generator=generator, requires_grad=True) for shape in shapes]
    out = attention.padded_sdpa_attention(*inputs, packed, window=window, scale=0.3)
    expected = attention.eager_attention(*inputs, packed, window=window, scale=0.3)
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=generator)
    grads = torch.autograd.grad(out, inputs, grad)
    for got, want in zip(grads, torch.autograd.grad(expected, inputs, grad), strict=True):
        torch.testing.assert_close(got, want)


def test_modules_built_on_meta_skip_their_initialisation_and_restore_it():
    from tuneforge.models.meta import on_meta

    originals = (torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters)
    with on_meta():
        linear = torch.nn.Linear(4, 4)
        embedding = torch.nn.Embedding(4, 4)
    assert linear.weight.is_meta and embedding.weight.is_meta
    torch.manual_seed(0)
    first = torch.nn.Linear(4, 4).weight
    torch.manual_seed(0)
    with torch.no_grad():
        second = torch.nn.init.kaiming_uniform_(torch.empty(4, 4), a=5**0.5)
    torch.testing.assert_close(first, second)  # nn.Linear's own initialisation is back
    with pytest.raises(RuntimeError), on_meta():
        raise RuntimeError("a failure while building")
    assert (torch.nn.Linear.reset_parameters, torch.nn.Embedding.reset_parameters) == originals


@pytest.mark.skipif(not torch.cuda.is_available(), reason="draws on a GPU")
def test_a_catalog_shape_drawn_on_the_gpu_and_held_in_host_memory_has_the_gpus_weights():
    """A QLoRA base is made in host memory with its values drawn on the GPU: the same weights
    as the shape made on the GPU itself."""
    on_gpu = tuneforge.load_model("demo-tiny", device="cuda", seed=3)
    on_host = tuneforge.load_model("demo-tiny", device="cpu", draw_on="cuda", seed=3)
    held = dict(on_host.named_parameters())
    for name, param in on_gpu.named_parameters():
        assert held[name].device.type == "cpu"
        torch.testing.assert_close(held[name], param.cpu(), rtol=0, atol=0, msg=name)
