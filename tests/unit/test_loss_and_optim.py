import math

import pytest
import torch
import torch.nn.functional as F

from tuneforge.config.sections.train import TrainSection
from tuneforge.data.packing import IGNORE_INDEX
from tuneforge.train.loss import chunked_cross_entropy
from tuneforge.train.optim import build_optimizer, learning_rate


@pytest.mark.parametrize(("fused", "compiled"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("chunk_size", [3, 16, 1024])
def test_chunked_cross_entropy_equals_plain_cross_entropy(chunk_size, fused, compiled):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 8, generator=generator, requires_grad=True)
    weight = torch.randn(50, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 50, (40,), generator=generator)
    labels[::3] = IGNORE_INDEX
    total, count = chunked_cross_entropy(hidden, weight, labels, chunk_size, fused, compiled)
    (total / count).backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    reference = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE_INDEX)
    reference.backward()
    assert count == int((labels != IGNORE_INDEX).sum())
    torch.testing.assert_close(total / count, reference)
    torch.testing.assert_close(got_grads[0], hidden.grad)
    torch.testing.assert_close(got_grads[1], weight.grad)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("weight_trains", [True, False])
def test_fused_cross_entropy_matches_the_checkpointed_path_in_bf16(weight_trains, compiled):
    """bf16 hidden states and output layer (a frozen one under LoRA): the fused path against
    the checkpointed reference, both casting the logits' gradient to bf16 before the GEMMs."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(300, 32, generator=generator).bfloat16().requires_grad_()
    weight = (0.2 * torch.randn(500, 32, generator=generator)).bfloat16()
    weight.requires_grad_(weight_trains)
    labels = torch.randint(0, 500, (300,), generator=generator)
    results = []
    for fused in (True, False):
        hidden.grad = weight.grad = None
        total, _ = chunked_cross_entropy(hidden, weight, labels, 128, fused, fused and compiled)
        (total * 0.01).backward()
        results.append((total, hidden.grad, weight.grad))
    (total, grad_hidden, grad_weight), (ref_total, ref_hidden, ref_weight) = results
    torch.testing.assert_close(total, ref_total, rtol=1e-4, atol=0)

    def relative(got, expected):
        return ((got.float() - expected.float()).norm() / expected.float().norm()).item()

    assert relative(grad_hidden, ref_hidden) < 1e-2
    if weight_trains:  # accumulated over chunks in bf16 by both paths, rounded differently
        assert relative(grad_weight, ref_weight) < 1e-2
    else:
        assert grad_weight is None and ref_weight is None


def test_the_supervised_rows_are_picked_without_waiting_for_the_device():
    """Given the count of supervised labels (known on the host), the rows are chosen with a
    static size (`nonzero_static`), not `nonzero`, whose size only the device knows; every
    label supervised: no selection at all. Same losses and gradients as counting on the device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(30, 8, generator=generator, requires_grad=True)
    weight = torch.randn(20, 8, generator=generator)
    all_labels = torch.randint(0, 20, (30,), generator=generator)
    some_labels = all_labels.clone()
    some_labels[::4] = IGNORE_INDEX
    for labels in (all_labels, some_labels):
        count = int((labels != IGNORE_INDEX).sum())
        results = []
        for known in (None, count):
            hidden.grad = None
            with Ops() as ops:
                total, got_count = chunked_cross_entropy(
                    hidden, weight, labels, 8, num_loss_tokens=known
                )
                total.backward()
            results.append((total, hidden.grad.clone(), ops.names))
        (expected, expected_grad, counted), (total, grad, static) = results
        assert got_count == count and "nonzero" in counted and "nonzero" not in static
        assert ("nonzero_static" in static) == (count < labels.numel())
        torch.testing.assert_close(total, expected)
        torch.testing.assert_close(grad, expected_grad)


def train_section(**kwargs) -> TrainSection:
    return TrainSection(max_steps=100, lr=1e-3, min_lr=1e-4, warmup_steps=10, **kwargs)


def test_fused_cross_entropy_holds_one_chunk_of_logits_at_a_time():
    """The peak of the fused loss: its gradient for the hidden states, the selected rows, and
    one chunk's logits in fp32 plus their bf16 product and gradient — never two chunks."""
    from tests.live_memory import LiveMemory

    tokens, dim, vocab, chunk = 4096, 64, 8192, 1024
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, dim, generator=generator).bfloat16().requires_grad_()
    weight = torch.randn(vocab, dim, generator=generator).bfloat16()
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    with LiveMemory() as memory:
        chunked_cross_entropy(hidden, weight, labels, chunk, fused=True)
    one_chunk = chunk * vocab * (4 + 2)
    rows = 2 * tokens * dim * 2  # the selected rows and their gradient
    assert one_chunk + rows <= memory.peak <= 1.1 * (one_chunk + rows) + 16 * tokens


def test_cosine_schedule_warms_up_then_decays_to_min_lr():
    train = train_section()
    assert learning_rate(0, 100, train) == pytest.approx(1e-4)
    assert learning_rate(9, 100, train) == pytest.approx(1e-3)
    assert learning_rate(10, 100, train) == pytest.approx(1e-3)
    midpoint = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert learning_rate(55, 100, train) == pytest.approx(midpoint)
    assert learning_rate(100, 100, train) == pytest.approx(1e-4)


def test_linear_and_constant_schedules():
    assert learning_rate(55, 100, train_section(schedule="linear")) == pytest.approx(
        1e-4 + 0.9e-3 * 0.5
    )
    assert learning_rate(80, 100, train_section(schedule="constant")) == pytest.approx(1e-3)


def test_weight_decay_skips_vectors():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, train_section(weight_decay=0.1), torch.device("cpu"))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and [p.ndim for p in decayed["params"]] == [2]
    assert plain["weight_decay"] == 0.0 and all(p.ndim == 1 for p in plain["params"])


def test_packed_and_padded_losses_equal_the_loss_of_each_document_alone(tmp_path):
    import tuneforge
    from tests.helpers import save_tiny_model
    from tuneforge.data.packing import collate, make_example

    save_tiny_model(tmp_path, "qwen3")
    model = tuneforge.load_model(tmp_path, dtype="float32", attention="sdpa")
    generator = torch.Generator().manual_seed(0)
    examples = []
    for length in (9, 30, 2, 17):
        ids = torch.randint(0, 128, (length,), generator=generator).tolist()
        mask = (torch.rand(length, generator=generator) > 0.4).tolist()
        examples.append(make_example(ids, mask))
    batch = collate(examples)
    with torch.no_grad():
        packed_sum, packed_count = chunked_cross_entropy(
            model.hidden_states(batch.tokens, batch.packed), model.lm_head.weight, batch.labels
        )
        alone_sum, alone_count = 0.0, 0
        for example in examples:
            logits = model(torch.tensor([example.input_ids]))[0]
            labels = torch.tensor(example.labels)
            alone_sum += F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
            alone_count += int((labels != IGNORE_INDEX).sum())
    assert packed_count == alone_count
    torch.testing.assert_close(packed_sum, alone_sum, rtol=1e-5, atol=1e-5)
    padded = collate(examples, padded=True)  # data.packing: none
    assert padded.tokens.numel() == 4 * 30 and padded.num_padding == 4 * 30 - (9 + 30 + 2 + 17)
    with torch.no_grad():
        padded_sum, padded_count = chunked_cross_entropy(
            model.hidden_states(padded.tokens, padded.packed), model.lm_head.weight, padded.labels
        )
    assert padded_count == alone_count
    torch.testing.assert_close(padded_sum, alone_sum, rtol=1e-5, atol=1e-5)
