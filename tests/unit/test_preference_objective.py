"""The preference objective on packed pairs: whole pairs side by side in each micro-batch; before
any update DPO's loss is ln 2; packed pairs give what each pair gives alone; and the loss and
the adapters' gradients equal a straightforward computation (each reply through the model alone
with its full logits, the reference a separately built base model, DPO's formula)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import adapted_tiny_model, pair_store, reply_logps, tiny_decoder
from tuneforge.data.packing import IGNORE_INDEX, collate_from
from tuneforge.data.pairs import pair_bins
from tuneforge.train.objectives.dpo import PreferenceObjective
from tuneforge.train.objectives.pairs import AdaptersOffReference, FrozenCopyReference
from tuneforge.train.objectives.preference_loss import PreferenceLoss


def test_micro_batches_hold_whole_pairs_side_by_side():
    lengths = [5, 9, 30, 2, 7, 7, 1, 40, 12, 3]
    bins = pair_bins(lengths, budget=45, strategy="ffd")
    documents = sorted(d for bin_ in bins for d in bin_)
    assert documents == list(range(len(lengths)))
    for bin_ in bins:
        assert sum(lengths[d] for d in bin_) <= 45
        assert all(bin_[i] % 2 == 0 and bin_[i + 1] == bin_[i] + 1 for i in range(0, len(bin_), 2))
    with pytest.raises(ValueError, match="two documents each"):
        pair_bins([1, 2, 3], 10)


def _adapter_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_before_any_update_the_dpo_loss_is_ln_2():
    model = adapted_tiny_model(trained=False)
    objective = PreferenceObjective(
        model, PreferenceLoss("sigmoid", 0.1), AdaptersOffReference(model)
    )
    store = pair_store(3)
    batch = collate_from(store, list(range(6)))
    out = objective(batch)
    assert objective.units(batch) == 3
    assert out.loss_sum.item() == pytest.approx(3 * math.log(2), abs=1e-6)
    assert out.metrics["reward_margin"].item() == 0.0
    assert out.metrics["reward_accuracy"].item() == 0.0


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
def test_packed_pairs_match_each_pair_alone_and_the_straightforward_computation(loss):
    store = pair_store(3)
    setting = PreferenceLoss(loss, beta=0.5)
    policy = adapted_tiny_model(trained=True)
    objective = PreferenceObjective(policy, setting, AdaptersOffReference(policy))
    packed = objective(collate_from(store, list(range(6))))
    packed.loss_sum.backward()
    packed_grads = _adapter_grads(policy)
    policy.zero_grad()
    alone = sum(objective(collate_from(store, [2 * p, 2 * p + 1])).loss_sum for p in range(3))
    assert packed.loss_sum.item() == pytest.approx(alone.item(), rel=1e-5)
    # the straightforward computation: full logits per reply, a separately built base model
    policy.zero_grad()
    torch.manual_seed(0)
    base = tiny_decoder(tied=False)  # the same weights as the policy's base
    expected = torch.zeros(())
    for pair in range(3):
        chosen, rejected = store[2 * pair], store[2 * pair + 1]
        pc = reply_logps(policy, chosen.input_ids, chosen.labels)
        pr = reply_logps(policy, rejected.input_ids, rejected.labels)
        with torch.no_grad():
            rc = reply_logps(base, chosen.input_ids, chosen.labels)
            rr = reply_logps(base, rejected.input_ids, rejected.labels)
        nc = sum(label != IGNORE_INDEX for label in chosen.labels)
        nr = sum(label != IGNORE_INDEX for label in rejected.labels)
        if loss == "simpo":
            expected = expected - F.logsigmoid(0.5 * (pc / nc - pr / nr) - 0.5)
        elif loss == "ipo":
            expected = expected + ((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * 0.5)) ** 2
        else:
            expected = expected - F.logsigmoid(0.5 * ((pc - pr) - (rc - rr)))
    expected.backward()
    assert packed.loss_sum.item() == pytest.approx(expected.item(), rel=1e-4)
    for name, grad in _adapter_grads(policy).items():
        assert torch.allclose(packed_grads[name], grad, rtol=1e-3, atol=1e-5), name


def test_a_frozen_copy_is_the_model_as_it_was():
    store = pair_store(2)
    policy = adapted_tiny_model(trained=True)
    reference = FrozenCopyReference(policy)
    objective = PreferenceObjective(policy, PreferenceLoss("sigmoid", 0.1), reference)
    batch = collate_from(store, list(range(4)))
    assert objective(batch).loss_sum.item() == pytest.approx(2 * math.log(2), abs=1e-6)
    with torch.no_grad():
        for param in policy.parameters():
            if param.requires_grad:
                param.add_(0.1)
    assert objective(batch).loss_sum.item() != pytest.approx(2 * math.log(2), abs=1e-3)
    assert not any(p.requires_grad for p in reference.model.parameters())
