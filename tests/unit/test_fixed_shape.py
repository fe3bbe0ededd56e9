"""Batches brought to a fixed shape for a captured step: the same tokens, documents, loss and
gradients as the batch as it came, with padding and empty document slots that change nothing."""

import dataclasses

import pytest
import torch

from tests.helpers import random_packed_batch, save_tiny_model
from tuneforge.config.sections.train import TrainSection
from tuneforge.data.fixed_shape import documents_needed, to_fixed_shape
from tuneforge.data.packing import IGNORE_INDEX, PAD_TOKEN
from tuneforge.errors import TuneforgeError
from tuneforge.execution.captured_step import captured_step_blockers
from tuneforge.models.api import load_model
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.apply import apply_lora
from tuneforge.train.loss import chunked_cross_entropy
from tuneforge.train.objectives.sft import NextTokenObjective
from tuneforge.train.optim import build_optimizer
from tuneforge.train.step import StepRunner


def test_a_short_batch_gets_a_padding_document_and_empty_slots():
    batch = random_packed_batch(1000, 200, False, seed=3)
    assert documents_needed(batch, 256) == batch.num_documents + 1
    fixed = to_fixed_shape(batch, 256, 8)
    cu = fixed.packed.cu_seqlens.tolist()
    assert len(cu) == 9 and fixed.packed.max_seqlen == 256
    assert cu[: batch.num_documents + 1] == batch.packed.cu_seqlens.tolist()
    assert cu[batch.num_documents + 1 :] == [256] * (8 - batch.num_documents)
    assert torch.equal(fixed.tokens[:200], batch.tokens)
    assert (fixed.tokens[200:] == PAD_TOKEN).all() and (fixed.labels[200:] == IGNORE_INDEX).all()
    assert fixed.packed.position_ids[200:].tolist() == list(range(56))
    assert fixed.num_padding == 56 and fixed.num_loss_tokens == batch.num_loss_tokens
    full = random_packed_batch(1000, 256, False, seed=3)
    assert to_fixed_shape(full, 256, full.num_documents).tokens.data_ptr() == full.tokens.data_ptr()


def test_a_batch_larger_than_the_shape_is_refused():
    batch = random_packed_batch(1000, 256, False, seed=0)
    with pytest.raises(ValueError, match="does not fit 128 tokens"):
        to_fixed_shape(batch, 128, 64)
    with pytest.raises(ValueError, match=f"in {batch.num_documents - 1} documents"):
        to_fixed_shape(batch, 256, batch.num_documents - 1)


@pytest.mark.parametrize(("fused", "compiled"), [(True, False), (True, True), (False, False)])
def test_every_row_gives_the_loss_and_gradients_of_the_supervised_rows(fused, compiled):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(300, 32, generator=generator)
    weight = torch.randn(50, 32, generator=generator)
    labels = torch.randint(0, 50, (300,), generator=generator)
    labels[::5] = IGNORE_INDEX
    count = int((labels != IGNORE_INDEX).sum())
    results = []
    for every_row in (False, True):
        x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        total, _ = chunked_cross_entropy(x, w, labels, 64, fused, compiled, count, every_row)
        (total / count).backward()
        results.append((total.detach(), x.grad, w.grad))
    (total, gx, gw), (ref_total, ref_gx, ref_gw) = results[1], results[0]
    torch.testing.assert_close(total, ref_total, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-6)
    assert gx[::5].abs().max() == 0  # the ignored rows get no gradient


def test_a_fixed_shape_batch_trains_as_the_batch_it_came_from():
    """The model's loss and the adapters' gradients: the batch as packed against it padded to
    more tokens and document slots, its loss over every row."""
    results = []
    for fixed in (False, True):
        torch.manual_seed(0)
        model = load_model("demo-tiny", dtype="float32", attention="eager", seed=0)
        lora = {"target_modules": ["all-linear"], "rank": 4, "alpha": 8}
        apply_lora(model, lora, torch.Generator().manual_seed(1), torch.float32)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
        objective = NextTokenObjective(model)
        batch = random_packed_batch(model.args.vocab_size, 200, False, seed=5)
        if fixed:
            objective.every_row_loss = True
            batch = to_fixed_shape(batch, 256, 16)
        loss_sum = objective(batch).loss_sum
        loss_sum.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss_sum.detach(), grads))
    (reference, reference_grads), (got, grads) = results
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    assert grads.keys() == reference_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6)


def test_padding_stays_out_of_the_moe_load_balancing_loss(tmp_path):
    """A tiny Qwen3-MoE model: the padded batch's losses and every gradient (the router's
    included) equal the batch's own; counting the padding would change the router's."""
    save_tiny_model(tmp_path, "qwen3_moe")
    results = []
    for fixed in (False, True, "padding counted"):
        model = load_hf_model(tmp_path, "float32", "eager")
        objective = NextTokenObjective(model)
        batch = random_packed_batch(model.args.vocab_size, 40, False, seed=1)
        if fixed:
            objective.every_row_loss = True
            batch = to_fixed_shape(batch, 64, 8)
        real = None if fixed == "padding counted" else batch.real_tokens
        loss_sum, aux, *_ = objective(dataclasses.replace(batch, real_tokens=real))
        (loss_sum + aux).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss_sum.detach(), aux.detach(), grads))
    (loss, aux, grads), (fixed_loss, fixed_aux, fixed_grads), (_, counted_aux, _) = results
    torch.testing.assert_close(fixed_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fixed_aux, aux, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(counted_aux, aux, rtol=1e-3)
    for name, grad in grads.items():
        torch.testing.assert_close(fixed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_captured_step_says_what_stands_in_its_way():
    model = load_model("demo-tiny", dtype="float32", attention="sdpa", seed=0)
    train = TrainSection(max_steps=1, tokens_per_micro_batch=64)
    optimizer = build_optimizer(model, train, torch.device("cpu"))
    blockers = captured_step_blockers(model, optimizer, train)
    assert any("not on a CUDA GPU" in b for b in blockers)
    assert any("attention ['sdpa']" in b for b in blockers)
    objective = NextTokenObjective(model)
    with pytest.raises(TuneforgeError, match=r"train\.cuda_graph: the model is not on a CUDA GPU"):
        StepRunner(
            objective,
            model,
            optimizer,
            train.model_copy(update={"cuda_graph": True}),
            torch.device("cpu"),
        )


def test_evaluation_projects_only_the_supervised_rows(monkeypatch):
    """The captured step's every-row loss is for training; evaluation runs eagerly and projects
    the supervised rows only, with the same loss."""
    from tuneforge.train.objectives import sft as objective_module

    seen = []
    original = objective_module.chunked_cross_entropy

    def spy(*args):
        seen.append(args[-1])
        return original(*args)

    monkeypatch.setattr(objective_module, "chunked_cross_entropy", spy)
    model = load_model("demo-tiny", dtype="float32", attention="eager", seed=0)
    objective = NextTokenObjective(model)
    objective.every_row_loss = True
    batch = random_packed_batch(model.args.vocab_size, 120, False, seed=3)
    trained = objective(batch).loss_sum
    objective.eval()
    with torch.no_grad():
        evaluated = objective(batch).loss_sum
    assert seen == [True, False]
    torch.testing.assert_close(evaluated, trained.detach(), rtol=1e-5, atol=1e-5)
