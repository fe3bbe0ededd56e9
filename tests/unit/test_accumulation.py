"""Gradient accumulation normalised by the units of the whole step (supervised tokens for SFT;
pairs, and chosen tokens for a token term, for a preference objective): the same documents split
over any number of micro-batches give the gradients of one big batch."""

import pytest
import torch

from tests.helpers import adapted_tiny_model, pair_store, save_tiny_model
from tuneforge.data.packing import collate, collate_from, make_example
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.train.objectives.dpo import PreferenceObjective
from tuneforge.train.objectives.orpo import OrpoObjective
from tuneforge.train.objectives.pairs import AdaptersOffReference
from tuneforge.train.objectives.preference_loss import PreferenceLoss
from tuneforge.train.objectives.seam import loss_value, step_units
from tuneforge.train.objectives.sft import NextTokenObjective
from tuneforge.train.step import backward_micro_batches


def documents():
    generator = torch.Generator().manual_seed(0)
    examples = []
    for length in (9, 30, 2, 17, 12, 25):
        ids = torch.randint(0, 128, (length,), generator=generator).tolist()
        mask = (torch.rand(length, generator=generator) > 0.3).tolist()
        examples.append(make_example(ids, mask))
    return examples


def gradients(model_dir, splits):
    objective = NextTokenObjective(load_hf_model(model_dir, "float32", "sdpa"))
    examples = documents()
    batches = [collate([examples[i] for i in split]) for split in splits]
    tokens = sum(batch.num_loss_tokens for batch in batches)
    loss = backward_micro_batches(objective, batches, 1 / tokens, 0.0)[0].item() / tokens
    return loss, {n: p.grad.clone() for n, p in objective.named_parameters()}


def test_any_split_equals_one_big_batch(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    loss, expected = gradients(tmp_path, [[0, 1, 2, 3, 4, 5]])
    for splits in ([[0, 1, 2], [3, 4, 5]], [[0], [1, 2, 3, 4], [5]]):
        split_loss, got = gradients(tmp_path, splits)
        assert abs(split_loss - loss) < 1e-6
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def pair_gradients(objective, store, splits):
    """One step of the pairs `splits` (lists of pair indexes) through `step_units` and
    `backward_micro_batches`, as the step runs them: the loss and the adapters' gradients."""
    objective.model.zero_grad()
    batches = [
        collate_from(store, [i for p in split for i in (2 * p, 2 * p + 1)]) for split in splits
    ]
    units = step_units(objective, batches, torch.device("cpu")).float()
    sums = backward_micro_batches(objective, batches, 1 / units[0], 0.0, (), 1 / units[1])
    loss = loss_value(*sums[:2].tolist(), *units.tolist())
    return loss, {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective_name", ["dpo_sft", "orpo"])
def test_a_pair_objectives_token_term_is_normalised_over_the_whole_step(objective_name):
    """The pairs' losses are averaged over the step's pairs, the chosen replies' NLL over the
    step's chosen tokens: splitting pairs of unequal lengths over micro-batches changes
    neither."""
    store = pair_store(5)
    policy = adapted_tiny_model(trained=True)
    if objective_name == "orpo":
        objective = OrpoObjective(policy, beta=0.3)
    else:
        setting = PreferenceLoss("sigmoid", beta=0.5, sft_weight=0.7)
        objective = PreferenceObjective(policy, setting, AdaptersOffReference(policy))
    loss, expected = pair_gradients(objective, store, [[0, 1, 2, 3, 4]])
    for splits in ([[0, 1], [2, 3, 4]], [[0], [1, 2, 3], [4]]):
        split_loss, got = pair_gradients(objective, store, splits)
        assert split_loss == pytest.approx(loss, rel=1e-6)
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
