import functools

import pytest
import torch

from tests.helpers import lora_gradients, packed_batch, save_tiny_llama
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.plan.policies import checkpointed_blocks, recomputed_blocks


def gradients(model):
    tokens = torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(2))
    model(tokens, cu_seqlens=torch.tensor([0, 10, 30])).logsumexp(-1).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_full_checkpointing_keeps_names_and_gradients(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    checkpointed = load_hf_model(tmp_path, "float32", "sdpa")
    wrap_blocks(checkpointed, BlockWrapping("full"))
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    expected, got = gradients(plain), gradients(checkpointed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_selective_checkpointing_takes_every_kth_block():
    assert checkpointed_blocks(6, "selective", 2) == [1, 3, 5]
    assert checkpointed_blocks(6, "selective", 3) == [2, 5]
    assert checkpointed_blocks(3, "full") == [0, 1, 2] and checkpointed_blocks(3, "none") == []


def test_the_last_recomputed_blocks_keep_their_activations():
    assert recomputed_blocks(6, "full", keep_activations=2) == {0, 1, 2, 3}
    assert recomputed_blocks(6, "selective", 2, keep_activations=1) == {1, 3}
    # blocks 1 and 4 wait in host memory; of the rest, the last two keep theirs
    assert recomputed_blocks(6, "full", offload_activations=2, keep_activations=2) == {0, 2}
    assert recomputed_blocks(6, "full", keep_activations=9) == set()


def test_kept_blocks_are_not_checkpointed_and_gradients_hold(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    wrap_blocks(model, BlockWrapping("full", keep_activations=1))
    *checkpointed, kept = model.layers
    assert all(isinstance(layer.forward, functools.partial) for layer in checkpointed)
    assert not isinstance(kept.forward, functools.partial)
    expected, got = gradients(plain), gradients(model)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_selective_checkpointing_keeps_gradients(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    checkpointed = load_hf_model(tmp_path, "float32", "sdpa")
    wrap_blocks(checkpointed, BlockWrapping("selective", 2))
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
    from tuneforge.packed import PackedSequences
    from tuneforge.train.objectives.sft import NextTokenObjective

    args = ModelArgs(
        vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=48,
        moe=MoEArgs(4, 2, 16),
    )  # fmt: skip
    results = []
    for checkpointing in ("none", "full"):
        torch.manual_seed(0)
        model = Decoder(args, "sdpa")
        model.init_weights(0.02, torch.Generator().manual_seed(0))
        wrap_blocks(model, BlockWrapping(checkpointing))
        objective = NextTokenObjective(model)
        tokens = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(1))
        loss_sum, aux, *_ = objective(
            packed_batch(tokens, tokens, PackedSequences.from_lengths([10, 14]))
        )
        (loss_sum + 0.1 * aux).backward()
        assert all(layer.mlp.last_router_logits is None for layer in model.layers)
        results.append({name: p.grad for name, p in model.named_parameters()})
    for name, expected in results[0].items():
        torch.testing.assert_close(results[1][name], expected, msg=name)


@pytest.mark.parametrize("checkpointing", ["full", "selective"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_offloaded_checkpointing_equals_no_checkpointing(checkpointing, dropout):
    expected_loss, expected = lora_gradients(dropout=dropout)
    loss, got = lora_gradients(checkpointing, offload=True, dropout=dropout)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert set(got) == set(expected) and len(got) == 3 * 7 * 2
    for name in expected:
        assert got[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_offloaded_checkpointing_of_a_fully_trained_model(tmp_path):
    save_tiny_llama(tmp_path)
    plain = load_hf_model(tmp_path, "float32", "sdpa")
    offloaded = load_hf_model(tmp_path, "float32", "sdpa")
    wrap_blocks(offloaded, BlockWrapping("full", offload=True))
    expected, got = gradients(plain), gradients(offloaded)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def test_offloaded_blocks_keep_only_host_copies():
    """Inside autograd, an offloaded block keeps no tensor of its own computation: what its
    forward saves is nothing but the host copy of its input."""
    from tuneforge.execution.offloaded_checkpoints import offloaded_checkpoint

    weight = torch.nn.Parameter(torch.randn(8, 8))
    saved = []
    run = offloaded_checkpoint(lambda x: torch.tanh(x @ weight) @ weight, [weight])
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = run(torch.randn(4, 8))
    assert saved == [] and y.requires_grad
    y.sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def test_offloaded_blocks_prefetch_the_input_below_once_their_backward_is_queued(monkeypatch):
    """Block i's backward, once queued, starts the copy back of block i-1's input: before block
    i's input gradient is handed on (on the GPU the copy then runs during block i's backward
    kernels); without a chain each input comes back only when its own block recomputes. The
    gradients are the same."""
    from tuneforge.execution import offloaded_checkpoints as offload

    weights = [torch.nn.Parameter(torch.randn(8, 8) / 3) for _ in range(3)]
    x = torch.randn(4, 8)
    events = []
    created = []
    original_init, original_prefetch = offload.HostCopy.__init__, offload.HostCopy.prefetch

    def init(self, tensor):
        original_init(self, tensor)
        created.append(self)

    def prefetch(self):
        if self.back is None:
            events.append(f"copy {created.index(self)}")
        original_prefetch(self)

    monkeypatch.setattr(offload.HostCopy, "__init__", init)
    monkeypatch.setattr(offload.HostCopy, "prefetch", prefetch)

    def chained_gradients(chain):
        events.clear()
        created.clear()

        def block(index):
            def run(h):
                if torch.is_grad_enabled():  # the recomputation in backward
                    events.append(f"run {index}")
                return torch.tanh(h @ weights[index])

            return offload.offloaded_checkpoint(run, [weights[index]], chain)

        h = x
        for index in range(3):
            h = block(index)(h)
            if index < 2:
                h.register_hook(lambda grad, index=index: events.append(f"grad {index + 1}"))
        return torch.autograd.grad(h.square().sum(), weights), list(events)

    expected, unchained = chained_gradients(None)
    got, chained = chained_gradients(offload.OffloadChain())
    assert unchained == [
        "copy 2",
        "run 2",
        "grad 2",
        "copy 1",
        "run 1",
        "grad 1",
        "copy 0",
        "run 0",
    ]
    assert chained == ["copy 2", "run 2", "copy 1", "grad 2", "run 1", "copy 0", "grad 1", "run 0"]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("autotune", [False, True])
def test_autotune_asks_inductor_to_time_the_matrix_products(tmp_path, monkeypatch, autotune):
    from tuneforge.execution import block_wrappers

    calls = []
    monkeypatch.setattr(
        block_wrappers.torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn
    )
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    wrap_blocks(model, BlockWrapping(compile=True, autotune=autotune))
    expected = {"max_autotune_gemm": True} if autotune else None
    assert calls == [{"options": expected}] * len(model.layers)


@pytest.mark.slow
def test_checkpointed_blocks_run_compiled():
    """The checkpoint wraps the compiled forward: compiling around `checkpoint` would silently
    run the blocks eagerly."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    expected_loss, expected = lora_gradients()
    loss, got = lora_gradients("full", compile=True)
    assert counters["stats"]["unique_graphs"] >= 3  # one graph per block at least
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=name, rtol=1e-4, atol=1e-6)


def test_offload_refused_where_it_cannot_work():
    from tuneforge.config.sections.train import TrainSection
    from tuneforge.errors import TuneforgeError
    from tuneforge.execution.block_wrappers import refuse_unsupported_offload
    from tuneforge.models.args import ModelArgs, MoEArgs

    train = TrainSection(max_steps=1, activation_checkpointing="full", offload_checkpoints=True)
    dense = ModelArgs(vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=48)
    refuse_unsupported_offload(train, 1, dense)
    with pytest.raises(TuneforgeError, match="one process"):
        refuse_unsupported_offload(train, 2, dense)
    moe = ModelArgs(
        vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=48,
        moe=MoEArgs(4, 2, 16),
    )  # fmt: skip
    with pytest.raises(TuneforgeError, match="aux loss"):
        refuse_unsupported_offload(train, 1, moe)
