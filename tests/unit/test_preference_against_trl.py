"""The preference objectives against TRL's own code on identical inputs: the same tiny Llama in
transformers (TRL's side) and in tuneforge, the same prompts and replies of unequal lengths.
TRL's `DPOTrainer._compute_loss` (DPO's sigmoid, IPO, the `sft` term), `CPOTrainer.cpo_loss`
(SimPO) and `ORPOTrainer.get_batch_loss_metrics` run on a stub `self`; the loss of one step of
one micro-batch and every parameter's gradient are compared. Skipped where TRL is not installed
(the `dev` extra installs it)."""

import warnings
from types import SimpleNamespace

import pytest
import torch

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer", reason="TRL is the oracle: .[dev]")
trl_utils = pytest.importorskip("trl.trainer.utils", reason="TRL is the oracle: .[dev]")
with warnings.catch_warnings():  # TRL's experimental trainers say so on import
    warnings.simplefilter("ignore")
    trl_cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer", reason=".[dev]")
    trl_orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer", reason=".[dev]")

from tests.helpers import (  # noqa: E402
    assert_gradients_equal,
    save_tiny_llama,
    trl_trainer_state,
)
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch  # noqa: E402
from tuneforge.models.hf.checkpoint import load_hf_model  # noqa: E402
from tuneforge.packed import PackedSequences  # noqa: E402
from tuneforge.train.objectives.dpo import PreferenceObjective  # noqa: E402
from tuneforge.train.objectives.orpo import OrpoObjective  # noqa: E402
from tuneforge.train.objectives.pairs import FrozenCopyReference  # noqa: E402
from tuneforge.train.objectives.preference_loss import PreferenceLoss  # noqa: E402

VOCAB = 96
PROMPTS = [4, 6, 3]
CHOSEN = [5, 2, 7]  # reply tokens; unequal lengths, so a mean per pair and per token differ
REJECTED = [3, 6, 1]


def pairs(prompts: list[int], seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """(prompt, chosen reply, rejected reply) token ids of each pair."""
    generator = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randint(1, VOCAB, (n,), generator=generator) for n in (p, c, r))
        for p, c, r in zip(prompts, CHOSEN, REJECTED, strict=True)
    ]


def packed_pairs(examples) -> PackedBatch:
    """Our batch: each pair's chosen document, then its rejected one, labels on the replies."""
    tokens, labels = [], []
    for prompt, *replies in examples:
        for reply in replies:
            document = torch.cat([prompt, reply])
            target = torch.full_like(document, IGNORE_INDEX)
            target[len(prompt) - 1 : -1] = reply
            tokens.append(document)
            labels.append(target)
    flat_labels = torch.cat(labels)
    return PackedBatch(
        torch.cat(tokens),
        flat_labels,
        PackedSequences.from_lengths([len(t) for t in tokens]),
        int((flat_labels != IGNORE_INDEX).sum()),
    )


def padded_rows(examples, which: int) -> dict[str, torch.Tensor]:
    """TRL's rows of reply `which` (1 chosen, 2 rejected): prompt + reply right-padded, their
    attention mask and the reply's mask."""
    documents = [torch.cat([example[0], example[which]]) for example in examples]
    width = max(len(d) for d in documents)
    ids = torch.zeros(len(documents), width, dtype=torch.long)
    attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (document, example) in enumerate(zip(documents, examples, strict=True)):
        ids[row, : len(document)] = document
        attention[row, : len(document)] = 1
        completion[row, len(example[0]) : len(document)] = 1
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def accelerator() -> SimpleNamespace:
    return SimpleNamespace(
        device=torch.device("cpu"),
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
    )


def models(directory):
    """transformers' policy and reference (of other weights), and ours of the same weights."""
    policy_hf = save_tiny_llama(directory / "policy", seed=0, vocab_size=VOCAB).float().train()
    reference_hf = save_tiny_llama(directory / "reference", seed=1, vocab_size=VOCAB).float()
    policy = load_hf_model(directory / "policy", "float32", "sdpa").train()
    reference = load_hf_model(directory / "reference", "float32", "sdpa")
    return policy_hf, reference_hf.eval().requires_grad_(False), policy, reference


def ours_step_loss(objective, batch: PackedBatch) -> torch.Tensor:
    """One step of one micro-batch, normalised as the step normalises it."""
    out = objective(batch)
    loss = out.loss_sum / objective.units(batch)
    if out.token_loss_sum is not None:
        loss = loss + out.token_loss_sum / objective.token_units(batch)
    return loss


def dpo_stub(model, reference, loss_types: list[str], weights: list[float], beta: float):
    """What TRL's `DPOTrainer._compute_loss` reads of its trainer (one process, a frozen
    reference model, no weighting or length desensitisation)."""
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    trl_utils.add_fused_lm_head(reference)
    return SimpleNamespace(
        accelerator=accelerator(),
        model=model,
        ref_model=reference,
        precompute_ref_logps=False,
        aux_loss_enabled=False,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        loss_types=loss_types,
        loss_weights=weights,
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        **trl_trainer_state(),
    )


@pytest.mark.parametrize(
    ("loss", "sft_weight"), [("sigmoid", 0.0), ("ipo", 0.0), ("sigmoid", 0.5), ("ipo", 0.3)]
)
def test_dpo_ipo_and_the_sft_term_are_trls(tmp_path, loss, sft_weight):
    """IPO on per-token mean log-ratios; `sft_weight` as TRL's `sft` loss term, the chosen
    replies' negative log-likelihood per token over all their tokens."""
    policy_hf, reference_hf, policy, reference = models(tmp_path)
    examples = pairs(PROMPTS)
    chosen, rejected = padded_rows(examples, 1), padded_rows(examples, 2)
    width = max(chosen["input_ids"].shape[1], rejected["input_ids"].shape[1])
    inputs = {
        key: torch.cat(
            [
                torch.nn.functional.pad(rows[key], (0, width - rows[key].shape[1]))
                for rows in (chosen, rejected)
            ]
        )
        for key in chosen
    }
    types, weights = [loss], [1.0]
    if sft_weight:
        types, weights = [loss, "sft"], [1.0, sft_weight]
    stub = dpo_stub(policy_hf, reference_hf, types, weights, beta=0.25)
    trl_loss = trl_dpo.DPOTrainer._compute_loss(stub, policy_hf, inputs, False)
    trl_loss.backward()

    setting = PreferenceLoss(loss, beta=0.25, sft_weight=sft_weight)
    objective = PreferenceObjective(policy, setting, FrozenCopyReference(reference))
    ours = ours_step_loss(objective, packed_pairs(examples))
    ours.backward()
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-7)
    assert_gradients_equal(policy_hf, policy)


def test_simpo_is_cpo_trainers_simpo_loss(tmp_path):
    """SimPO as TRL's CPOTrainer takes it: on each reply's mean log-probability, with the target
    margin γ/β inside β·(...)."""
    policy_hf, _, policy, _ = models(tmp_path)
    examples = pairs(PROMPTS)
    stub = SimpleNamespace(
        accelerator=accelerator(),
        alpha=0.0,
        beta=2.0,
        simpo_gamma=0.5,
        label_smoothing=0.1,
        loss_type="simpo",
    )
    logps = []
    for which in (1, 2):
        rows = padded_rows(examples, which)
        labels = rows["input_ids"].masked_fill(rows["completion_mask"] == 0, IGNORE_INDEX)
        logits = policy_hf(rows["input_ids"], attention_mask=rows["attention_mask"]).logits
        logps.append(trl_cpo.CPOTrainer.get_batch_logps(logits, labels, average_log_prob=True))
    losses, _, _ = trl_cpo.CPOTrainer.cpo_loss(stub, *logps)
    trl_loss = losses.mean()
    trl_loss.backward()

    setting = PreferenceLoss("simpo", beta=2.0, simpo_gamma=0.5, label_smoothing=0.1)
    objective = PreferenceObjective(policy, setting, None)
    ours = ours_step_loss(objective, packed_pairs(examples))
    ours.backward()
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-7)
    assert_gradients_equal(policy_hf, policy)


def test_orpo_is_orpo_trainers(tmp_path):
    """The whole ORPO loss of TRL's `get_batch_loss_metrics`: the chosen replies' NLL per token
    over the batch's chosen tokens, minus λ·log σ(log odds ratio) averaged over the pairs.
    TRL's NLL counts the prompt's tokens too (`concatenated_forward`); ours the reply's, as the
    paper's L_SFT; with one-token prompts (nothing of a prompt is predicted) they are the same."""
    policy_hf, _, policy, _ = models(tmp_path)
    examples = pairs([1, 1, 1])
    batch = {}
    for which, name in ((1, "chosen"), (2, "rejected")):
        rows = padded_rows(examples, which)
        batch[f"{name}_input_ids"] = rows["input_ids"]
        batch[f"{name}_attention_mask"] = rows["attention_mask"]
        labels = rows["input_ids"].masked_fill(rows["completion_mask"] == 0, IGNORE_INDEX)
        batch[f"{name}_labels"] = labels
    stub = SimpleNamespace(
        accelerator=accelerator(),
        is_encoder_decoder=False,
        padding_value=0,
        aux_loss_enabled=False,
        beta=0.3,
        concatenated_inputs=trl_orpo.ORPOTrainer.concatenated_inputs,
        get_batch_logps=trl_orpo.ORPOTrainer.get_batch_logps,
    )
    stub.odds_ratio_loss = lambda *logps: trl_orpo.ORPOTrainer.odds_ratio_loss(stub, *logps)
    stub.concatenated_forward = lambda model, inputs: trl_orpo.ORPOTrainer.concatenated_forward(
        stub, model, inputs
    )
    trl_loss, trl_metrics = trl_orpo.ORPOTrainer.get_batch_loss_metrics(stub, policy_hf, batch)
    trl_loss.backward()

    objective = OrpoObjective(policy, beta=0.3)
    packed = packed_pairs(examples)
    ours = ours_step_loss(objective, packed)
    ours.backward()
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-7)
    assert_gradients_equal(policy_hf, policy)
    out = objective(packed)
    assert out.metrics["log_odds_ratio"].item() / 3 == pytest.approx(
        trl_metrics["log_odds_ratio"], rel=1e-5
    )
