"""One optimizer step queued without waiting for the device: a non-finite step skipped by the
optimizer's own kernel exactly as the host's check skips it, and the same numbers either way."""

import math

import pytest
import torch

from tests.helpers import random_packed_batch
from tuneforge.config.sections.train import TrainSection
from tuneforge.models.api import load_model
from tuneforge.train import step as step_module
from tuneforge.train.objectives.sft import NextTokenObjective
from tuneforge.train.optim import build_optimizer
from tuneforge.train.step import optimizer_step

CPU = torch.device("cpu")


def poisoned(forward):
    def forward_with_nan_loss(*args):
        output = forward(*args)
        return output._replace(loss_sum=output.loss_sum * math.nan)

    return forward_with_nan_loss


def run_steps(poisoned_step: int | None, on_device: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(step_module, "skips_on_device", lambda optimizer: on_device)
    torch.manual_seed(0)
    model = load_model("demo-tiny", dtype="float32", attention="sdpa", seed=0)
    objective = NextTokenObjective(model)
    train = TrainSection(max_steps=3, tokens_per_micro_batch=64)
    optimizer = build_optimizer(model, train, CPU)
    results, snapshots = [], []
    for index in range(3):
        batch = random_packed_batch(model.args.vocab_size, 64, False, seed=index)
        if index == poisoned_step:
            objective.forward = poisoned(objective.forward)
        results.append(optimizer_step(objective, model, optimizer, iter([batch]), train, 1e-3, CPU))
        objective.__dict__.pop("forward", None)
        snapshots.append([p.detach().clone() for p in model.parameters()])
    steps = [s["step"].item() for s in optimizer.state.values()]
    return [r.get() for r in results], snapshots, steps


@pytest.mark.parametrize("on_device", [True, False])
def test_a_non_finite_step_changes_nothing_and_is_reported(on_device, monkeypatch):
    results, snapshots, steps = run_steps(1, on_device, monkeypatch)
    assert [r["finite"] for r in results] == [True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(snapshots[0], snapshots[1], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(snapshots[1], snapshots[2], strict=True))
    assert set(steps) == {2.0}  # the skipped step does not count for the bias correction


def test_the_device_side_skip_gives_the_host_side_numbers(monkeypatch):
    on_device = run_steps(1, True, monkeypatch)
    on_host = run_steps(1, False, monkeypatch)
    for got, expected in zip(on_device[0], on_host[0], strict=True):
        assert got.keys() == expected.keys()
        for key in got:
            assert got[key] == expected[key] or (math.isnan(got[key]) and math.isnan(expected[key]))
    for a, b in zip(on_device[1][-1], on_host[1][-1], strict=True):
        assert torch.equal(a, b)
