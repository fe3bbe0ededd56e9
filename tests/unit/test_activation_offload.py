import pytest
import torch

from tests.helpers import lora_gradients
from tuneforge.execution import activation_offload
from tuneforge.execution.activation_offload import SavedOnHost, offloaded_activations
from tuneforge.execution.offloaded_checkpoints import OffloadChain
from tuneforge.plan.policies import offloaded_blocks


@pytest.fixture
def offload_everything(monkeypatch):
    """The tiny test models' activations are far below the size worth a copy."""
    monkeypatch.setattr(activation_offload, "MIN_OFFLOAD_BYTES", 0)


def test_offloaded_blocks_are_spread_evenly():
    assert offloaded_blocks(32, 0) == []
    assert offloaded_blocks(32, 4) == [4, 12, 20, 28]
    assert offloaded_blocks(3, 3) == [0, 1, 2]
    assert offloaded_blocks(3, 9) == [0, 1, 2]


@pytest.mark.parametrize(
    "wrap",
    [
        {"offload_activations": 3},
        {"offload_activations": 1, "checkpointing": "full", "offload": True},
        {"offload_activations": 2, "checkpointing": "full", "compile": True},
    ],
    ids=["all-blocks", "among-offloaded-checkpoints", "compiled"],
)
def test_offloaded_activations_give_the_same_gradients(offload_everything, monkeypatch, wrap):
    offloaded = []
    pack = SavedOnHost.pack
    monkeypatch.setattr(
        SavedOnHost, "pack", lambda self, t: offloaded.append(pack(self, t)) or offloaded[-1]
    )
    dropout = 0.0 if wrap.get("compile") else 0.2  # compiled dropout draws other masks
    expected_loss, expected = lora_gradients(dropout=dropout)
    checkpointing = wrap.pop("checkpointing", "none")
    loss, got = lora_gradients(checkpointing, dropout=dropout, **wrap)
    assert (
        sum(not isinstance(p, torch.Tensor) for p in offloaded) >= 10 * wrap["offload_activations"]
    )
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], expected[name], msg=name, rtol=1e-4, atol=1e-6)


def test_saved_tensors_go_to_the_host_but_weights_and_shared_inputs_stay():
    weight = torch.nn.Parameter(torch.randn(8, 8))
    shared = torch.randn(8)
    saved = SavedOnHost({weight.untyped_storage().data_ptr(), shared.data_ptr()}, 0)
    x = torch.randn(4, 8)
    transposed = x.t()
    assert saved.pack(weight) is weight and saved.pack(shared) is shared
    packed = [saved.pack(t) for t in (x, transposed, x[1:3, 2:])]
    assert not any(isinstance(p, torch.Tensor) for p in packed)
    assert len(saved.copies) == 1  # one storage, copied once
    saved.seal()
    for original, restored in zip(
        (x, transposed, x[1:3, 2:]), map(saved.unpack, packed), strict=True
    ):
        assert restored.stride() == original.stride()
        assert restored.storage_offset() == original.storage_offset()
        assert restored.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
        torch.testing.assert_close(restored, original)


def test_small_tensors_stay(monkeypatch):
    saved = SavedOnHost(set(), min_bytes=1024)
    small, large = torch.randn(16), torch.randn(512)
    assert saved.pack(small) is small
    assert not isinstance(saved.pack(large), torch.Tensor)


def test_a_block_below_comes_back_once_the_block_above_reached_its_input(offload_everything):
    """Three blocks with offloaded activations: block i's backward, once it has given its input
    a gradient, starts block i-1's activations back; the gradients are those of the plain run."""
    weights = [torch.nn.Parameter(torch.randn(8, 8) / 3) for _ in range(3)]
    x = torch.randn(4, 8, requires_grad=True)
    events = []

    class Recorded(SavedOnHost):
        def prefetch(self):
            if not self.fetched:
                events.append(f"prefetch {self.index}")
            super().prefetch()

        def unpack(self, packed):
            if not self.restored:
                events.append(f"unpack {self.index}")
            return super().unpack(packed)

    created = []

    def made(*args):
        group = Recorded(*args)
        group.index = len(created)
        created.append(group)
        return group

    def run_blocks(offloaded):
        chain = OffloadChain()
        h = x
        for index in range(3):
            module = torch.nn.Module()
            module.weight = weights[index]

            def run(h, index=index):
                return torch.tanh(h @ weights[index])

            block = offloaded_activations(run, module, chain) if offloaded else run
            h = block(h)
        return torch.autograd.grad(h.square().sum(), [x, *weights])

    expected = run_blocks(False)
    original = activation_offload.SavedOnHost
    activation_offload.SavedOnHost = made
    try:
        got = run_blocks(True)
    finally:
        activation_offload.SavedOnHost = original
    # the last block fetches its own when backward first reads it
    assert events == [
        "unpack 2",
        "prefetch 2",
        "prefetch 1",
        "unpack 1",
        "prefetch 0",
        "unpack 0",
    ]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_offloaded_activations_refused_where_they_cannot_work():
    from tuneforge.config.sections.train import TrainSection
    from tuneforge.errors import TuneforgeError
    from tuneforge.execution.block_wrappers import refuse_unsupported_offload
    from tuneforge.models.args import ModelArgs

    args = ModelArgs(vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=48)
    refuse_unsupported_offload(TrainSection(max_steps=1, offload_activations=2), 1, args)
    with pytest.raises(TuneforgeError, match="model has 2 blocks"):
        refuse_unsupported_offload(TrainSection(max_steps=1, offload_activations=3), 1, args)
    with pytest.raises(TuneforgeError, match="offload_activations runs on one process"):
        refuse_unsupported_offload(TrainSection(max_steps=1, offload_activations=1), 2, args)


def test_the_host_waits_for_copies_more_than_two_blocks_behind():
    """Where memory is tight (always, on a machine without a GPU), pushing a block waits (on the
    host) for the newest earlier copy past two of the largest block's bytes: the memory it read
    is then free before the forward asks for more."""

    class Sent:
        def __init__(self, name, nbytes):
            self.name, self.nbytes = name, nbytes

        def wait_sent(self):
            waited.append(self.name)

    waited = []
    chain = OffloadChain()
    items = [
        Sent(f"{kind}{i}", 400 if kind == "host" else 32)
        for i, kind in enumerate(["host", "input", "host", "input", "host", "input", "host"])
    ]
    after_each = []
    for item in items:
        chain.push(item)
        after_each.append(list(waited))
        waited.clear()
    # the limit is 800: from the newest sent back, host2 + input1 + host0 pass it at input3's push
    assert after_each == [[], [], [], ["host0"], ["host0"], ["host2"], ["host2"]]


def test_memory_is_tight_within_the_margin_of_the_allocators_limit(monkeypatch):
    """The limit is the GPU's memory times the process's fraction (a held run's cap)."""
    import types

    from tuneforge.execution.offloaded_checkpoints import memory_is_tight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=100)
    )
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.5)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 40)
    assert not memory_is_tight(5)
    assert memory_is_tight(15)
