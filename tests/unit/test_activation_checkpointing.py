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


def test_checkpointed_moe_blocks_keep_nothing_after_backward():
    """The router logits a checkpointed block recomputes in backward would hold that block's
    activations until the next forward; the objective records them only in its own forward."""
    from tuneforge.models.args import ModelArgs, MoEArgs
    from tuneforge.models.decoder import Decoder
    from tuneforge.models.packed import PackedSequences
    from tuneforge.train.objective import NextTokenObjective

    args = ModelArgs(
        vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=48,
        moe=MoEArgs(4, 2, 16),
    )  # fmt: skip
    results = []
    for checkpointing in ("none", "full"):
        torch.manual_seed(0)
        model = Decoder(args, "sdpa")
        model.init_weights(0.02, torch.Generator().manual_seed(0))
        apply_activation_checkpointing(model, checkpointing)
        objective = NextTokenObjective(model)
        tokens = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(1))
        loss_sum, aux = objective(tokens, tokens, PackedSequences.from_lengths([10, 14]))
        (loss_sum + 0.1 * aux).backward()
        assert all(layer.mlp.last_router_logits is None for layer in model.layers)
        results.append({name: p.grad for name, p in model.named_parameters()})
    for name, expected in results[0].items():
        torch.testing.assert_close(results[1][name], expected, msg=name)
