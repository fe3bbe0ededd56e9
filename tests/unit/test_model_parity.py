"""Our decoder against transformers on tiny random weights (fp32, CPU), for every family."""

import pytest
import torch
import transformers

from tests.helpers import FAMILIES, hf_name_of, save_tiny_model
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import load_hf_model, save_hf_model
from tuneforge.packed import PackedSequences

LENGTHS = [7, 19, 1, 12]


def documents():
    return [
        torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS
    ]


def hf_logits_per_document(hf_model, docs):
    return torch.cat([hf_model(doc[None]).logits[0] for doc in docs])


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("backend", ["sdpa", "sdpa_padded", "eager"])
def test_packed_logits_match_separate_hf_forwards(tmp_path, family, backend):
    hf_model = save_tiny_model(tmp_path, family)
    ours = load_hf_model(tmp_path, "float32", backend)
    docs = documents()
    with torch.no_grad():
        expected = hf_logits_per_document(hf_model, docs)
        got = ours(torch.cat(docs), cu_seqlens=PackedSequences.from_lengths(LENGTHS).cu_seqlens)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_logits_match_a_padded_hf_batch(tmp_path, family):
    """The documents right-padded in one batch with transformers' attention mask."""
    hf_model = save_tiny_model(tmp_path, family)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    docs = documents()
    longest = max(LENGTHS)
    ids = torch.zeros(len(docs), longest, dtype=torch.long)
    mask = torch.zeros(len(docs), longest, dtype=torch.long)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
    with torch.no_grad():
        padded = hf_model(ids, attention_mask=mask).logits
        expected = torch.cat([padded[row, :length] for row, length in enumerate(LENGTHS)])
        got = ours(torch.cat(docs), cu_seqlens=PackedSequences.from_lengths(LENGTHS).cu_seqlens)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_tied_embeddings_match(tmp_path):
    hf_model = save_tiny_model(tmp_path, "llama", tie_word_embeddings=True)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    assert ours.lm_head.weight is ours.embed.weight
    tokens = documents()[1]
    with torch.no_grad():
        torch.testing.assert_close(
            ours(tokens[None]), hf_model(tokens[None]).logits, atol=2e-5, rtol=1e-5
        )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gradients_match_hf(tmp_path, family):
    hf_model = save_tiny_model(tmp_path, family)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    docs = documents()
    hf_model.train()
    hf_logits_per_document(hf_model, docs).square().mean().backward()
    ours(
        torch.cat(docs), cu_seqlens=PackedSequences.from_lengths(LENGTHS).cu_seqlens
    ).square().mean().backward()
    hf_params = dict(hf_model.named_parameters())
    adapter = adapter_for(ours.args.family)
    for name, param in ours.named_parameters():
        if ".mlp.experts." in name:
            # transformers holds experts as we do: gate_up_proj [E, 2I, D], down_proj [E, D, I]
            layer, projection = name.split(".")[1], name.rsplit(".", 1)[1]
            fused = hf_params[f"model.layers.{layer}.mlp.experts.{projection}"]
            torch.testing.assert_close(param.grad, fused.grad, atol=1e-6, rtol=1e-4, msg=name)
            continue
        hf_grad = hf_params[hf_name_of(adapter, name)].grad
        torch.testing.assert_close(param.grad, hf_grad, atol=1e-6, rtol=1e-5, msg=name)


def test_moe_aux_loss_matches_transformers(tmp_path):
    hf_model = save_tiny_model(tmp_path, "qwen3_moe")
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf_model(tokens).aux_loss
        ours(tokens)
        got = ours.aux_loss()
    assert got is not None
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_transformers_to_us_to_transformers(tmp_path, family):
    hf_model = save_tiny_model(tmp_path / "source", family)
    ours = load_hf_model(tmp_path / "source", "float32", "sdpa")
    save_hf_model(ours, tmp_path / "saved", max_shard_bytes=60_000)
    assert (tmp_path / "saved" / "model.safetensors.index.json").is_file()  # sharded
    model_class = getattr(transformers, FAMILIES[family][1])
    reloaded = model_class.from_pretrained(tmp_path / "saved").eval()
    tokens = documents()[1][None]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, hf_model(tokens).logits, atol=0, rtol=0)


def test_num_layers_override_keeps_the_first_layers(tmp_path):
    save_tiny_model(tmp_path, "llama", num_hidden_layers=3)
    ours = load_hf_model(tmp_path, "float32", "sdpa", num_layers=1)
    assert len(ours.layers) == 1
    full = load_hf_model(tmp_path, "float32", "sdpa")
    torch.testing.assert_close(ours.layers[0].attn.q_proj.weight, full.layers[0].attn.q_proj.weight)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parameter_count_formula_matches_the_module(tmp_path, family):
    hf_model = save_tiny_model(tmp_path, family)
    ours = load_hf_model(tmp_path, "float32", "sdpa")
    assert ours.args.num_params() == sum(p.numel() for p in ours.parameters())
    assert ours.args.num_params() == sum(p.numel() for p in hf_model.parameters())
