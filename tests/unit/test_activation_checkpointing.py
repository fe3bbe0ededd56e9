import torch

from tests.helpers import save_tiny_llama
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.train.loop import apply_activation_checkpointing


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
