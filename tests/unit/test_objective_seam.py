"""The objective seam: the step normalises by whatever units an objective counts and reports its
metrics per unit, so another objective plugs in without touching the step or the loop."""

import pytest
import torch

from tuneforge.bench.batches import synthetic_batch
from tuneforge.config import load_config
from tuneforge.config.schema import TrainSection
from tuneforge.data.packing import PackedBatch
from tuneforge.models.api import load_model
from tuneforge.train.objective import NextTokenObjective, ObjectiveOutput
from tuneforge.train.schedule import Schedule
from tuneforge.train.step import optimizer_step

CPU = torch.device("cpu")


class PerDocument(NextTokenObjective):
    """Token losses summed, normalised per document; reports the supervised tokens per document."""

    metric_names = ("loss_tokens",)

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
    batches = [synthetic_batch(model.args.vocab_size, 128, False, seed=s) for s in (1, 2)]
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


def test_the_schedule_says_what_happens_at_each_step():
    config = load_config(
        "examples/demo.yaml",
        ["checkpoint.save_steps=4", "eval.every_steps=3", "logging.projection_step=5"],
    )
    schedule = Schedule(config, total_steps=9, evaluates=True)
    plans = {step: schedule.at(step) for step in range(1, 10)}
    assert [s for s, p in plans.items() if p.save] == [4, 8]
    assert [s for s, p in plans.items() if p.evaluate] == [3, 6]  # the last step evaluates anyway
    assert [s for s, p in plans.items() if p.project] == [5]
    assert [s for s, p in plans.items() if p.last] == [9]
    assert [s for s, p in plans.items() if p.read_now] == [3, 4, 5, 6, 8, 9]
    assert not Schedule(config, 9, evaluates=False).at(3).evaluate
