"""Our decoder against transformers' Llama on tiny random weights (fp32, CPU)."""

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.helpers import save_tiny_llama
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import CheckpointError, load_hf_model, save_hf_model
from tuneforge.models.packed import PackedSequences

LENGTHS = [7, 19, 1, 12]


def hf_logits_per_document(hf_model, documents):
    return torch.cat([hf_model(doc[None]).logits[0] for doc in documents])


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("tied", [False, True])
def test_packed_logits_match_separate_hf_forwards(tmp_path, backend, tied):
    hf_model = save_tiny_llama(tmp_path, tie_word_embeddings=tied)
    ours = load_hf_model(tmp_path, "float32", backend)
    documents = [
        torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS
    ]
    packed = PackedSequences.from_lengths(LENGTHS)
    with torch.no_grad():
        expected = hf_logits_per_document(hf_model, documents)
        got = ours(torch.cat(documents), packed)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_gradients_match_hf(tmp_path):
    hf_model = save_tiny_llama(tmp_path)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    documents = [
        torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS
    ]
    hf_model.train()
    hf_logits_per_document(hf_model, documents).square().mean().backward()
    ours(torch.cat(documents), PackedSequences.from_lengths(LENGTHS)).square().mean().backward()
    hf_grads = dict(hf_model.named_parameters())
    for name, param in ours.named_parameters():
        hf_name = adapter_for("llama").to_hf(name)
        torch.testing.assert_close(
            param.grad, hf_grads[hf_name].grad, atol=1e-6, rtol=1e-4, msg=name
        )


def test_saved_model_loads_in_transformers_with_same_logits(tmp_path):
    save_tiny_llama(tmp_path / "source")
    ours = load_hf_model(tmp_path / "source", "float32", "sdpa")
    save_hf_model(ours, tmp_path / "saved", max_shard_bytes=60_000)
    assert (tmp_path / "saved" / "model.safetensors.index.json").is_file()  # sharded
    reloaded_hf = LlamaForCausalLM.from_pretrained(tmp_path / "saved").eval()
    reloaded_ours = load_hf_model(tmp_path / "saved", "float32", "sdpa")
    tokens = torch.randint(0, 128, (15,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reloaded_hf(tokens[None]).logits[0]
        torch.testing.assert_close(ours(tokens, PackedSequences.from_lengths([15])), expected)
        torch.testing.assert_close(
            reloaded_ours(tokens, PackedSequences.from_lengths([15])), expected
        )


def test_num_layers_override_keeps_the_first_layers(tmp_path):
    save_tiny_llama(tmp_path, num_hidden_layers=3)
    ours = load_hf_model(tmp_path, "float32", "sdpa", num_layers=1)
    assert len(ours.layers) == 1
    full = load_hf_model(tmp_path, "float32", "sdpa")
    torch.testing.assert_close(ours.layers[0].attn.q_proj.weight, full.layers[0].attn.q_proj.weight)


def test_missing_weights_are_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    save_tiny_llama(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing \['layers.1.mlp.up_proj.weight'\]"):
        load_hf_model(tmp_path, "float32", "sdpa")


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_formula_matches_the_module(tmp_path, tied):
    hf_model = save_tiny_llama(tmp_path, tie_word_embeddings=tied)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    assert ours.args.num_params() == sum(p.numel() for p in ours.parameters())
    assert ours.args.num_params() == sum(p.numel() for p in hf_model.parameters())
