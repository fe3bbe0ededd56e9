"""The objective seam: the step normalises by whatever units an objective counts and reports its
metrics per unit, so another objective plugs in without touching the step or the loop."""

from typing import get_args

import pytest
import torch

from tests.helpers import random_packed_batch
from tuneforge.config.sections.train import TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.models.api import load_model
from tuneforge.train.objectives.seam import Metric, ObjectiveOutput
from tuneforge.train.objectives.sft import NextTokenObjective
from tuneforge.train.step import optimizer_step

CPU = torch.device("cpu")


class PerDocument(NextTokenObjective):
    """Token losses summed, normalised per document; reports the supervised tokens per document."""

    metrics = (Metric("loss_tokens"),)

    def units(self, batch: PackedBatch) -> int:
        return batch.num_documents

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        output = super().forward(batch)
        counted = torch.tensor(float(batch.num_loss_tokens))
        return output._replace(metrics={"loss_tokens": counted})


def test_the_step_normalises_by_the_objectives_units_and_reports_its_metrics():
    model = load_model("demo-tiny", dtype="float32", attention="sdpa", seed=0)
    train = TrainSection(
        max_steps=1, tokens_per_micro_batch=128, grad_accum_steps=2, clip_grad_norm=None
    )
    batches = [random_packed_batch(model.args.vocab_size, 128, False, seed=s) for s in (1, 2)]
    objective = PerDocument(model)
    documents = sum(b.num_documents for b in batches)
    reference = 0.0
    for batch in batches:  # the per-document mean, one micro-batch at a time
        loss = objective(batch).loss_sum / documents
        loss.backward()
        reference += loss.item()
    expected = {n: p.detach() - 0.5 * p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # the update is -lr x gradient
    result = optimizer_step(objective, model, optimizer, iter(batches), train, 0.5, CPU).get()
    assert result["loss"] == pytest.approx(reference, rel=1e-6)
    assert result["loss_tokens"] == documents  # the units the step counted
    tokens = sum(b.num_loss_tokens for b in batches)
    assert result["metrics"]["loss_tokens"] == pytest.approx(tokens / documents)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.detach(), expected[name])


class Rollout(NextTokenObjective):
    """Makes its own batch from the one read (as a sampler of completions would): here, the
    read batch's tokens reversed, every one supervised."""

    def make_batch(self, read: PackedBatch | None, read_more=None) -> PackedBatch:
        assert read is not None
        tokens = read.tokens.flip(0)
        return random_packed_batch(
            self.model.args.vocab_size, tokens.numel(), True, seed=int(tokens[0])
        )


def test_the_step_trains_on_the_batch_an_objective_makes_itself():
    model = load_model("demo-tiny", dtype="float32", attention="sdpa", seed=0)
    train = TrainSection(max_steps=1, tokens_per_micro_batch=128, clip_grad_norm=None)
    read = random_packed_batch(model.args.vocab_size, 128, False, seed=1)
    objective = Rollout(model)
    made = objective.make_batch(read)
    assert not torch.equal(made.tokens, read.tokens)
    with torch.no_grad():
        expected = (objective(made).loss_sum / made.num_loss_tokens).item()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    result = optimizer_step(objective, model, optimizer, iter([read]), train, 0.0, CPU).get()
    assert result["loss"] == pytest.approx(expected, rel=1e-6)


def test_every_declared_objective_has_a_component_and_no_other():
    """The config's declarations and the trainer's components name the same objectives, each
    component with its own declaration; the objective field accepts exactly those names."""
    from tuneforge.config.objectives.registry import OBJECTIVES
    from tuneforge.train.objectives.registry import COMPONENTS

    assert (
        set(COMPONENTS)
        == set(OBJECTIVES)
        == set(get_args(TrainSection.model_fields["objective"].annotation))
    )
    for name, component in COMPONENTS.items():
        assert component.declaration is OBJECTIVES[name]
