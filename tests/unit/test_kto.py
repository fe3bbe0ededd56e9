"""KTO against TRL's own code on identical inputs: the same tiny Llama in transformers (TRL's
side) and in tuneforge, the same prompts, completions, labels and mismatched samples. TRL's
`KTOTrainer._compute_loss` runs on a stub `self` with a frozen reference model; the loss of one
step of one micro-batch and every parameter's gradient are compared. Skipped where TRL is not
installed (the `dev` extra installs it). The records' documents (`data/unpaired.py`) are checked
here too."""

from types import MethodType, SimpleNamespace

import pytest
import torch

from tests.helpers import assert_gradients_equal, save_tiny_llama, trl_trainer_state
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.unpaired import LABEL, labelled_records, with_mismatched
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.packed import PackedSequences
from tuneforge.train.objectives.kto import KtoObjective
from tuneforge.train.objectives.pairs import FrozenCopyReference

VOCAB = 96
PROMPTS = [4, 6, 3, 5]
COMPLETIONS = [5, 2, 7, 3]
LABELS = [True, False, True, False]


def records(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(1, VOCAB, (p,), generator=generator),
         torch.randint(1, VOCAB, (c,), generator=generator))
        for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
    ]  # fmt: skip


def mismatched(examples):
    """Each record's prompt with the previous record's completion (TRL's rotation)."""
    return [(prompt, examples[index - 1][1]) for index, (prompt, _) in enumerate(examples)]


def document(prompt, completion):
    tokens = torch.cat([prompt, completion])
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[len(prompt) - 1 : -1] = completion
    return tokens, labels


def packed_records(examples, labels) -> PackedBatch:
    """Our batch: each record's document, then its mismatched sample; the label on the first."""
    parts = []
    for matched, other in zip(examples, mismatched(examples), strict=True):
        parts += [document(*matched), document(*other)]
    tokens, targets = torch.cat([t for t, _ in parts]), torch.cat([lab for _, lab in parts])
    fields: list[dict[str, object]] = []
    for label in labels:
        fields += [{LABEL: label}, {}]
    return PackedBatch(
        tokens,
        targets,
        PackedSequences.from_lengths([len(t) for t, _ in parts]),
        int((targets != IGNORE_INDEX).sum()),
        record_fields=fields,
    )


def padded(pairs, prefix: str = "") -> dict[str, torch.Tensor]:
    """TRL's rows: prompt + completion right-padded, the attention and completion masks."""
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.zeros(len(pairs), width, dtype=torch.long)
    attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (prompt, reply) in enumerate(pairs):
        n = len(prompt) + len(reply)
        ids[row, :n] = torch.cat([prompt, reply])
        attention[row, :n] = 1
        completion[row, len(prompt) : n] = 1
    return {
        f"{prefix}input_ids": ids,
        f"{prefix}attention_mask": attention,
        f"{prefix}completion_mask": completion,
    }


def kto_stub(model, reference, beta: float, weights: tuple[float, float]):
    """What TRL's `KTOTrainer._compute_loss` reads of its trainer (one process, a frozen
    reference model, the KL term on)."""
    trl_kto = pytest.importorskip("trl.trainer.kto_trainer", reason="TRL is the oracle: .[dev]")
    trl_utils = pytest.importorskip("trl.trainer.utils", reason="TRL is the oracle: .[dev]")
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits"))
    trl_utils.add_fused_lm_head(reference)
    stub = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x),
        model=model,
        ref_model=reference,
        calculate_KL=True,
        precompute_ref_logps=False,
        aux_loss_enabled=False,
        loss_type="kto",
        beta=beta,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
        **trl_trainer_state(),
    )
    stub._compute_kl_logps = MethodType(trl_kto.KTOTrainer._compute_kl_logps, stub)
    return stub, trl_kto.KTOTrainer._compute_loss


@pytest.mark.parametrize(
    ("beta", "weights", "labels", "seeds"),
    [
        (0.1, (1.0, 1.0), LABELS, (0, 1)),
        (0.5, (1.33, 0.7), LABELS, (0, 1)),
        (0.3, (1.0, 1.0), [True, True, True, False], (0, 1)),
        (0.5, (1.33, 0.7), LABELS, (1, 0)),
    ],
)
def test_the_loss_and_every_gradient_are_trls(tmp_path, beta, weights, labels, seeds):
    """The policy and reference seeds (0, 1) give a negative KL estimate, clamped to 0; (1, 0)
    a positive one, so the reference point z is in the loss."""
    policy_hf = save_tiny_llama(tmp_path / "policy", seed=seeds[0], vocab_size=VOCAB)
    policy_hf = policy_hf.float().train()
    reference_hf = save_tiny_llama(tmp_path / "reference", seed=seeds[1], vocab_size=VOCAB).float()
    reference_hf.eval().requires_grad_(False)
    policy = load_hf_model(tmp_path / "policy", "float32", "sdpa").train()
    reference = load_hf_model(tmp_path / "reference", "float32", "sdpa")
    examples = records()
    stub, compute_loss = kto_stub(policy_hf, reference_hf, beta, weights)
    inputs = padded(examples) | padded(mismatched(examples), "KL_")
    inputs["label"] = torch.tensor(labels)
    trl_loss = compute_loss(stub, policy_hf, inputs, False)
    trl_loss.backward()

    objective = KtoObjective(policy, FrozenCopyReference(reference), beta, weights)
    batch = packed_records(examples, labels)
    out = objective(batch)
    loss = out.loss_sum / objective.units(batch)
    loss.backward()
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert out.metrics["kl"].item() / 4 == pytest.approx(stub._metrics["train"]["kl"][0], rel=1e-5)
    assert (out.metrics["kl"].item() > 0) == (seeds == (1, 0))
    assert out.metrics["desirable"].item() == sum(labels)
    assert_gradients_equal(policy_hf, policy)


def conversation(prompt: str, reply: str, origin: str, **kwargs) -> Conversation:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
    return Conversation(messages, origin, **kwargs)


def test_pairs_split_into_alternating_labels_whose_mismatched_samples_share_no_prompt():
    found = [
        conversation("p0", "good", "u.jsonl:1", desirable=True),
        conversation("p1", "a", "pairs.jsonl:1", rejected="b"),
        conversation("p2", "c", "pairs.jsonl:2", rejected="d"),
    ]
    labelled = labelled_records(found)
    assert [(r.messages[-1]["content"], r.desirable) for r in labelled] == [
        ("good", True), ("a", True), ("d", False), ("b", False), ("c", True),
    ]  # fmt: skip
    documents = with_mismatched(labelled)
    assert len(documents) == 10
    for index, record in enumerate(labelled):
        matched, other = documents[2 * index], documents[2 * index + 1]
        assert matched.messages == record.messages
        assert other.messages[0] == record.messages[0]  # its prompt
        assert other.messages[-1] == labelled[index - 1].messages[-1]  # the previous reply
        assert labelled[index - 1].messages[0] != record.messages[0]
    with pytest.raises(DataError, match=r"plain\.jsonl:3: KTO trains on labelled replies"):
        labelled_records([conversation("p", "r", "plain.jsonl:3")])
