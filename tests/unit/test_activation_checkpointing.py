import functools

import torch

from tests.helpers import save_tiny_llama
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.train.block_wrappers import apply_activation_checkpointing, checkpointed_blocks


def gradients(model):
    tokens = torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(2))
    model(tokens, cu_seqlens=torch.tensor([0, 10, 30])).logsumexp(-1).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_full_checkpointing_keeps_names_and_gradients(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    checkpointed = load_hf_model(tmp_path, "float32", "sdpa")
    apply_activation_checkpointing(checkpointed)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    expected, got = gradients(plain), gradients(checkpointed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_selective_checkpointing_takes_every_kth_block():
    assert checkpointed_blocks(6, "selective", 2) == [1, 3, 5]
    assert checkpointed_blocks(6, "selective", 3) == [2, 5]
    assert checkpointed_blocks(3, "full") == [0, 1, 2] and checkpointed_blocks(3, "none") == []


def test_selective_checkpointing_keeps_gradients(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    checkpointed = load_hf_model(tmp_path, "float32", "sdpa")
    apply_activation_checkpointing(checkpointed, "selective", 2)
    assert isinstance(checkpointed.layers[1].forward, functools.partial)
    assert not isinstance(checkpointed.layers[0].forward, functools.partial)
    expected, got = gradients(plain), gradients(checkpointed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)
