"""The preference objective on packed pairs: whole pairs side by side in each micro-batch; before
any update DPO's loss is ln 2; packed pairs give what each pair gives alone; and the loss and
the adapters' gradients equal a straightforward computation (each reply through the model alone
with its full logits, the reference a separately built base model, DPO's formula)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_decoder
from tuneforge.data.packing import IGNORE_INDEX, collate_from
from tuneforge.data.pairs import pair_bins
from tuneforge.data.token_store import TokenStore, make_example
from tuneforge.peft.apply import apply_lora
from tuneforge.train.preference import (
    AdaptersOffReference,
    FrozenCopyReference,
    PreferenceObjective,
)
from tuneforge.train.preference_loss import PreferenceLoss


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


def _store(pairs: int) -> TokenStore:
    """Pairs sharing a prompt (not supervised), each reply supervised."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(pairs):
        prompt = torch.randint(0, 64, (6,), generator=generator).tolist()
        for reply_length in torch.randint(3, 9, (2,), generator=generator).tolist():
            reply = torch.randint(0, 64, (reply_length,), generator=generator).tolist()
            ids = prompt + reply
            examples.append(make_example(ids, [False] * len(prompt) + [True] * len(reply)))
    return TokenStore.from_examples(examples)


def _model(trained: bool):
    torch.manual_seed(0)
    model = tiny_decoder(tied=False)
    apply_lora(model, {"target_modules": ["all-linear"], "rank": 4, "alpha": 8})
    if trained:  # adapters away from their start, so the policy differs from the reference
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


def _adapter_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_before_any_update_the_dpo_loss_is_ln_2():
    model = _model(trained=False)
    objective = PreferenceObjective(
        model, PreferenceLoss("sigmoid", 0.1), AdaptersOffReference(model)
    )
    store = _store(3)
    batch = collate_from(store, list(range(6)))
    out = objective(batch)
    assert objective.units(batch) == 3
    assert out.loss_sum.item() == pytest.approx(3 * math.log(2), abs=1e-6)
    assert out.metrics["reward_margin"].item() == 0.0
    assert out.metrics["reward_accuracy"].item() == 0.0


def _reply_logps(model, ids, labels):
    logits = model(torch.tensor(ids)[None])[0].float()
    labels = torch.tensor(labels)
    supervised = labels != IGNORE_INDEX
    return F.log_softmax(logits, -1)[supervised].gather(1, labels[supervised][:, None]).sum()


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
def test_packed_pairs_match_each_pair_alone_and_the_straightforward_computation(loss):
    store = _store(3)
    setting = PreferenceLoss(loss, beta=0.5)
    policy = _model(trained=True)
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
        pc = _reply_logps(policy, chosen.input_ids, chosen.labels)
        pr = _reply_logps(policy, rejected.input_ids, rejected.labels)
        with torch.no_grad():
            rc = _reply_logps(base, chosen.input_ids, chosen.labels)
            rr = _reply_logps(base, rejected.input_ids, rejected.labels)
        nc = sum(label != IGNORE_INDEX for label in chosen.labels)
        nr = sum(label != IGNORE_INDEX for label in rejected.labels)
        if loss == "simpo":
            expected = expected - F.logsigmoid(0.5 * (pc / nc - pr / nr) - 0.5)
        elif loss == "ipo":
            expected = expected + ((pc - pr) - (rc - rr) - 1 / (2 * 0.5)) ** 2
        else:
            expected = expected - F.logsigmoid(0.5 * ((pc - pr) - (rc - rr)))
    expected.backward()
    assert packed.loss_sum.item() == pytest.approx(expected.item(), rel=1e-4)
    for name, grad in _adapter_grads(policy).items():
        assert torch.allclose(packed_grads[name], grad, rtol=1e-3, atol=1e-5), name


def test_a_frozen_copy_is_the_model_as_it_was():
    store = _store(2)
    policy = _model(trained=True)
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
