"""The reward model (`train.objective: reward`) against its references: the loss and every
gradient against TRL's own `RewardTrainer.compute_loss` run on a stub `self` with transformers'
`LlamaForSequenceClassification` of the same weights (margins, the centring term, and a
document ending in the padding token, whose score both read one token earlier); the saved
checkpoint against transformers' `AutoModelForSequenceClassification`, its adapters folded in;
and the configuration's refusals."""

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from tests.helpers import (
    issues_of,
    save_tiny_llama,
    save_tiny_reward_llama,
    trl_trainer_state,
)
from tuneforge.config import load_config
from tuneforge.config.errors import ConfigError
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import load_hf_model, save_hf_model
from tuneforge.models.score_head import (
    SCORE_WEIGHT,
    attach_score_head,
    score_head_of,
    sequence_scores,
)
from tuneforge.packed import PackedSequences
from tuneforge.peft.apply import apply_lora, merged_weights
from tuneforge.train.objectives.reward import RewardModelObjective

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trl_reward = pytest.importorskip("trl.trainer.reward_trainer", reason="TRL is the oracle")

VOCAB, PAD = 96, 0
REPO = Path(__file__).resolve().parents[2]
LENGTHS = [(7, 5), (4, 9), (6, 6)]  # (chosen, rejected) document lengths of three pairs


def documents(seed: int = 0) -> list[torch.Tensor]:
    """[chosen, rejected, ...]; the second pair's rejected document ends with the padding token."""
    generator = torch.Generator().manual_seed(seed)
    found = [torch.randint(1, VOCAB, (n,), generator=generator) for pair in LENGTHS for n in pair]
    found[3][-1] = PAD
    return found


def packed(found: list[torch.Tensor], margins: list[float] | None) -> PackedBatch:
    tokens = torch.cat(found)
    fields = None
    if margins is not None:
        fields = [f for m in margins for f in ({"margin": m}, {})]
    return PackedBatch(
        tokens,
        torch.full_like(tokens, IGNORE_INDEX),
        PackedSequences.from_lengths([len(d) for d in found]),
        0,
        record_fields=fields,
    )


def right_padded(found: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """TRL's batch: the chosen rows, then the rejected ones, right-padded with the pad token."""
    rows = [*found[0::2], *found[1::2]]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def reward_stub(model, center: float | None):
    state = trl_trainer_state()
    state["args"] = SimpleNamespace(center_rewards_coefficient=center)
    accelerator = SimpleNamespace(gather=lambda x: x, gather_for_metrics=lambda x: x)
    return SimpleNamespace(model=model, accelerator=accelerator, **state)


@pytest.mark.parametrize(
    ("margins", "center"), [(None, None), ([0.5, -1.0, 2.0], None), ([0.0, 1.5, 0.25], 0.01)]
)
def test_the_loss_and_gradients_are_reward_trainers(tmp_path, margins, center):
    hf = save_tiny_reward_llama(tmp_path / "rm").train()
    ours = load_hf_model(tmp_path / "rm", "float32", "sdpa").train()
    assert score_head_of(ours) is not None
    found = documents()
    inputs = right_padded(found)
    if margins is not None:
        inputs["margin"] = torch.tensor(margins)
    trl_loss = trl_reward.RewardTrainer.compute_loss(reward_stub(hf, center), hf, inputs)
    trl_loss.backward()

    objective = RewardModelObjective(ours, center)
    batch = packed(found, margins)
    out = objective(batch)
    loss = out.loss_sum / objective.units(batch)
    loss.backward()
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    hf_params = dict(hf.named_parameters())
    adapter = adapter_for(ours.args.family)
    compared = 0
    for name, param in ours.named_parameters():
        if param.grad is None:  # the output layer, which a reward model does not run
            assert name == "lm_head.weight"
            continue
        hf_name = name if name == SCORE_WEIGHT else adapter.runtime_name(adapter.to_hf(name))
        expected = hf_params[hf_name].grad
        torch.testing.assert_close(
            param.grad, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()), msg=name
        )
        compared += 1
    assert compared == len(hf_params)


def test_the_pad_rule_moves_the_score_a_token_back(tmp_path):
    """The document ending in the padding token is scored at the token before it (as
    transformers reads it), which differs from the score at its last token."""
    save_tiny_reward_llama(tmp_path / "rm")
    load = load_hf_model(tmp_path / "rm", "float32")
    found = documents()
    batch = packed(found, None)
    head = score_head_of(load)
    assert head is not None and head.pad_token_id == PAD
    with torch.no_grad():
        hidden = load.hidden_states(batch.tokens, batch.packed)
        scores = sequence_scores(head, hidden, batch.tokens, batch.packed.cu_seqlens)
        end = int(batch.packed.cu_seqlens[4]) - 1
        at_last = head(hidden[end]).squeeze(-1)
        before = head(hidden[end - 1]).squeeze(-1)
    torch.testing.assert_close(scores[3], before)
    assert not torch.allclose(scores[3], at_last)


def test_a_saved_reward_model_scores_as_transformers_reads_it(tmp_path):
    """A causal model given a fresh head and random adapters, saved with its adapters folded
    in: AutoModelForSequenceClassification scores padded rows as ours scores the packed
    documents, unmerged; config.json names one label and the padding token."""
    save_tiny_llama(tmp_path / "base", vocab_size=VOCAB)
    model = load_hf_model(tmp_path / "base", "float32")
    lora = {"target_modules": ["all-linear"], "rank": 4, "alpha": 8}
    apply_lora(model, lora, torch.Generator().manual_seed(1), torch.float32)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    attach_score_head(model, PAD, torch.Generator().manual_seed(2))
    found = documents(seed=3)
    batch = packed(found, None)
    with torch.no_grad():
        head = score_head_of(model)
        assert head is not None
        hidden = model.hidden_states(batch.tokens, batch.packed)
        ours = sequence_scores(head, hidden, batch.tokens, batch.packed.cu_seqlens)
    save_hf_model(model, tmp_path / "rm", state=merged_weights(model))

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert hf.config.num_labels == 1 and hf.config.pad_token_id == PAD
    assert type(hf).__name__ == "LlamaForSequenceClassification"
    rows = right_padded(found)
    with torch.no_grad():
        theirs = hf(**rows).logits.squeeze(-1)
    order = [*range(0, len(found), 2), *range(1, len(found), 2)]
    torch.testing.assert_close(ours[order], theirs, rtol=1e-4, atol=1e-5)


def reward_config(*overrides: str):
    data = REPO / "tuneforge" / "assets" / "demo_data"
    pairs = [
        f"data.train=[{{path: {data / 'pairs_train.jsonl'}, format: preference}}]",
        f"data.eval=[{{path: {data / 'pairs_eval.jsonl'}, format: preference}}]",
    ]
    demo = REPO / "examples" / "demo.yaml"
    return load_config(demo, [*pairs, "train.objective=reward", *overrides])


def test_a_reward_model_reads_pairs():
    config = reward_config("reward.center_rewards_coefficient=0.01")
    assert config.reward.center_rewards_coefficient == 0.01
    with pytest.raises(ConfigError) as error:
        load_config(REPO / "examples" / "demo.yaml", ["train.objective=reward"])
    assert "trains on pairs" in issues_of(error.value)["data.train.0.format"]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("lora.use_dora=true", "lora.use_dora"),
        ("model.quantize=nf4", "model.quantize"),
        ("parallel.tensor_parallel=2", "parallel.tensor_parallel"),
    ],
)
def test_settings_a_reward_model_cannot_save_are_refused(override, field):
    with pytest.raises(ConfigError) as error:
        reward_config("lora.enabled=true", override)
    assert field in issues_of(error.value)


def test_a_model_reward_scores_the_conversation_the_chat_template_renders(tmp_path, monkeypatch):
    """GRPO's `model` reward: a prompt (rendered for the reply, as GRPO decodes it) and a
    completion score as AutoModelForSequenceClassification scores the conversation the chat
    template renders, for several completions at once, batched in runs of documents."""
    import shutil

    import tuneforge.train.objectives.model_reward as model_reward
    from tuneforge.assets import DEMO_TOKENIZER_DIR

    save_tiny_llama(tmp_path / "base", vocab_size=512)
    model = load_hf_model(tmp_path / "base", "float32")
    attach_score_head(model, 0, torch.Generator().manual_seed(2))
    save_hf_model(model, tmp_path / "rm")
    for file in DEMO_TOKENIZER_DIR.iterdir():
        shutil.copy(file, tmp_path / "rm" / file.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "rm")
    asked = ["add: 2 + 1", "sort: 3 1 2", "max: 9 1 6"]
    replies = ["3", "1 2 3", "1"]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in asked
    ]
    reward = model_reward.ModelReward(tmp_path / "rm", torch.device("cpu"), "float32")
    monkeypatch.setattr(model_reward, "TOKENS_PER_BATCH", 40)  # two batches
    ours = reward(prompts=prompts, completions=replies, completion_ids=[[0]] * 3)

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    expected = []
    for question, reply in zip(asked, replies, strict=True):
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected.append(float(hf(input_ids=ids).logits[0, 0]))
    assert ours == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert len(set(ours)) == 3


def test_a_model_reward_needs_a_reward_models_directory(tmp_path):
    save_tiny_llama(tmp_path / "causal")
    grpo = REPO / "examples" / "demo-grpo.yaml"
    for path, says in ((tmp_path / "causal", "not a sequence classifier"), (tmp_path, "no config")):
        with pytest.raises(ConfigError) as error:
            load_config(grpo, [f"grpo.rewards=[{{function: model, path: {path}}}]"])
        assert says in issues_of(error.value)["grpo.rewards.0.path"]
    with pytest.raises(ConfigError) as error:
        load_config(grpo, ["grpo.rewards=[{function: model}]"])
    assert "needs the reward model" in issues_of(error.value)["grpo.rewards.0.path"]
    with pytest.raises(ConfigError) as error:  # a missing directory is one problem, said once
        load_config(grpo, [f"grpo.rewards=[{{function: model, path: {tmp_path / 'none'}}}]"])
    assert [str(issue) for issue in error.value.issues if issue.path == "grpo.rewards.0.path"] == [
        issues_of(error.value)["grpo.rewards.0.path"]
    ]
    assert "no such file or directory" in issues_of(error.value)["grpo.rewards.0.path"]
