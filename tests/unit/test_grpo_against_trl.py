"""GRPO against TRL's own code on identical inputs: the same tiny Llama in transformers (TRL's
side) and in tuneforge, the same prompts, completions, advantages and old and reference
log-probabilities. TRL's `GRPOTrainer._get_per_token_logps_and_entropies` (with its fused LM
head at the sampling temperature) and `_compute_loss` run on a stub `self`, since its trainer
needs more than a CPU to start; its advantage block runs as its own source text. Skipped where
TRL is not installed (the `dev` extra installs it)."""

import contextlib
import inspect
import textwrap
from collections import defaultdict
from types import MethodType, SimpleNamespace

import pytest
import torch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is the oracle: .[dev]")
trl_utils = pytest.importorskip("trl.trainer.utils", reason="TRL is the oracle: .[dev]")

from transformers import AutoTokenizer  # noqa: E402

from tests.helpers import hf_name_of, save_tiny_llama  # noqa: E402
from tuneforge.assets import DEMO_TOKENIZER_DIR  # noqa: E402
from tuneforge.config.objectives.grpo import GrpoSection  # noqa: E402
from tuneforge.data.packing import IGNORE_INDEX, PackedBatch  # noqa: E402
from tuneforge.models.hf.adapter import adapter_for  # noqa: E402
from tuneforge.models.hf.checkpoint import load_hf_model  # noqa: E402
from tuneforge.packed import PackedSequences  # noqa: E402
from tuneforge.train.objectives.grpo import GrpoObjective  # noqa: E402
from tuneforge.train.objectives.grpo_advantages import group_advantages  # noqa: E402
from tuneforge.train.objectives.pairs import model_token_logps  # noqa: E402
from tuneforge.train.objectives.rewards import weighted_rewards  # noqa: E402

VOCAB = 384  # the demo tokenizer's
PROMPT = 5
LENGTHS = [4, 2, 6, 3, 5, 1]  # the completions' tokens; two groups of three
MAX_NEW_TOKENS = 6
EPSILON, EPSILON_HIGH = 0.2, 0.28


def trl_stub(model, loss_type: str = "grpo", beta: float = 0.0) -> SimpleNamespace:
    """What TRL's `_compute_loss` reads of its trainer, for one process and one micro-batch a
    step, with no entropy bonus, masking or vLLM correction."""
    accelerator = SimpleNamespace(
        autocast=contextlib.nullcontext,
        is_main_process=True,
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )
    stub = SimpleNamespace(
        accelerator=accelerator,
        model=model,
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        loss_type=loss_type,
        epsilon_low=EPSILON,
        epsilon_high=EPSILON_HIGH,
        use_vllm=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW_TOKENS,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    method = trl_grpo.GRPOTrainer._get_per_token_logps_and_entropies
    stub._get_per_token_logps_and_entropies = MethodType(method, stub)
    return stub


def models(directory, temperature: float):
    """transformers' model with TRL's fused head at `temperature`, and ours, of equal weights."""
    hf = save_tiny_llama(directory, vocab_size=VOCAB).float().train()
    trl_utils.add_fused_lm_head(hf, temperature=temperature, outputs=("log_probs", "entropy"))
    return hf, load_hf_model(directory, "float32", "sdpa").train()


def completions(seed: int = 0) -> dict[str, torch.Tensor]:
    """TRL's inputs: prompts of one length, completions right-padded to the longest."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(LENGTHS)
    completion_mask = torch.zeros(rows, MAX_NEW_TOKENS, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        completion_mask[row, :length] = 1
    return {
        "prompt_ids": torch.randint(0, VOCAB, (rows, PROMPT), generator=generator),
        "prompt_mask": torch.ones(rows, PROMPT, dtype=torch.long),
        "completion_ids": torch.randint(0, VOCAB, (rows, MAX_NEW_TOKENS), generator=generator),
        "completion_mask": completion_mask,
    }


def packed(
    inputs: dict[str, torch.Tensor], lengths: list[int] = LENGTHS
) -> tuple[PackedBatch, torch.Tensor]:
    """Our batch of the same documents (each prompt with its completion of `lengths`' tokens,
    no padding), and the flat index of each completion token's label, row by row of TRL's grid."""
    tokens, labels, where = [], [], []
    for row, length in enumerate(lengths):
        document = torch.cat([inputs["prompt_ids"][row], inputs["completion_ids"][row, :length]])
        target = torch.full_like(document, IGNORE_INDEX)
        target[PROMPT - 1 : -1] = document[PROMPT:]
        start = sum(len(t) for t in tokens)
        where.append(torch.arange(start + PROMPT - 1, start + PROMPT - 1 + length))
        tokens.append(document)
        labels.append(target)
    flat_labels = torch.cat(labels)
    batch = PackedBatch(
        torch.cat(tokens),
        flat_labels,
        PackedSequences.from_lengths([PROMPT + length for length in lengths]),
        int((flat_labels != IGNORE_INDEX).sum()),
    )
    return batch, torch.cat(where)


def flat(
    grid: torch.Tensor, batch: PackedBatch, where: torch.Tensor, lengths: list[int] = LENGTHS
) -> torch.Tensor:
    """TRL's [rows, MAX_NEW_TOKENS] values at our packed label rows (0 elsewhere)."""
    mask = torch.arange(MAX_NEW_TOKENS)[None] < torch.tensor(lengths)[:, None]
    values = torch.zeros(batch.tokens.numel(), dtype=grid.dtype)
    values[where] = grid[mask]
    return values


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_log_probabilities_are_trls_at_the_sampling_temperature(tmp_path, temperature):
    hf, ours = models(tmp_path, temperature)
    inputs = completions()
    batch, where = packed(inputs)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        theirs, _, _ = trl_stub(hf)._get_per_token_logps_and_entropies(
            hf, ids, mask, MAX_NEW_TOKENS
        )
        mine = model_token_logps(ours, batch, chunk_tokens=7, temperature=temperature)
    torch.testing.assert_close(mine[where], flat(theirs, batch, where)[where], rtol=0, atol=2e-5)


def grpo_objective(model, loss_type: str, beta: float, temperature: float) -> GrpoObjective:
    section = GrpoSection(
        num_generations=3,
        max_new_tokens=MAX_NEW_TOKENS,
        loss_type=loss_type,
        beta=beta,
        temperature=temperature,
        epsilon=EPSILON,
        epsilon_high=EPSILON_HIGH,
    )
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    return GrpoObjective(model, section, tokenizer, [], None, accumulation=1, seed=0)


def rollout_extras(advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the objective's forward reads of a rollout besides the advantages (for metrics)."""
    rows = advantages.numel()
    return {
        "advantages": advantages,
        "rewards": torch.zeros(rows),
        "unscored": torch.zeros(()),
        "reward_by_function": torch.zeros(rows, 0),
        "completion_length": torch.zeros(rows),
        "group_std": torch.zeros(rows // 3),
        "zero_std": torch.zeros(rows // 3),
        "generated_tokens": torch.zeros(1),
        "generation_s": torch.zeros(1),
        "sampling_rounds": torch.ones(1),
    }


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("beta", "later_iteration"), [(0.0, False), (0.04, True)])
def test_the_loss_and_every_gradient_are_trls(
    tmp_path, loss_type, temperature, beta, later_iteration
):
    """On-policy with no KL term, and a later iteration (the sampler's log-probabilities apart
    from the policy's, some ratios past both clips) with the KL term to a reference."""
    hf, ours = models(tmp_path, temperature)
    inputs = completions()
    batch, where = packed(inputs)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    stub = trl_stub(hf, loss_type, beta)
    with torch.no_grad():
        policy, _, _ = stub._get_per_token_logps_and_entropies(hf, ids, mask, MAX_NEW_TOKENS)
    generator = torch.Generator().manual_seed(1)
    advantages = torch.tensor([1.1, -0.4, -0.7, 0.5, -1.3, 0.8])
    trl_inputs = dict(inputs, advantages=advantages)
    trl_inputs["num_items_in_batch"] = inputs["completion_mask"].sum().float()
    extras = rollout_extras(advantages)
    if later_iteration:
        old = policy + 0.3 * torch.randn(policy.shape, generator=generator)
        ref = policy + 0.2 * torch.randn(policy.shape, generator=generator)
        trl_inputs |= {"old_per_token_logps": old, "ref_per_token_logps": ref}
        extras |= {"old_logps": flat(old, batch, where), "ref_logps": flat(ref, batch, where)}
    batch.extras = extras

    trl_loss = trl_grpo.GRPOTrainer._compute_loss(stub, hf, trl_inputs)
    trl_loss.backward()
    objective = grpo_objective(ours, loss_type, beta, temperature)
    out = objective(batch)
    loss = out.loss_sum / objective.units(batch)
    loss.backward()

    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    if later_iteration:
        assert out.metrics["clip_ratio"] > 0  # the clip is exercised
    hf_params = dict(hf.named_parameters())
    adapter = adapter_for(ours.args.family)
    for name, param in ours.named_parameters():
        expected = hf_params[hf_name_of(adapter, name)].grad
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-7, msg=name)


def trl_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group: int, scale: str):
    """TRL's own advantage block (from `unscorable_mask` to its `nan_to_num`), run as written,
    summing weighted rewards then normalising (its default)."""
    source = textwrap.dedent(
        inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions)
    )
    last = "advantages = torch.nan_to_num(advantages, nan=0.0)"
    start = source.rindex("\n", 0, source.index("unscorable_mask = ")) + 1
    block = textwrap.dedent(source[start : source.index(last) + len(last)])
    self = SimpleNamespace(
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=weights,
        scale_rewards=scale,
    )
    scope = {
        "torch": torch,
        "nanstd": trl_utils.nanstd,
        "self": self,
        "rewards_per_func": rewards_per_func,
        "num_generations": group,
        "device": rewards_per_func.device,
    }
    exec(compile(block, "trl-advantages", "exec"), scope)
    return scope["advantages"]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_are_trls_with_unscored_completions(scale):
    """Two reward functions, each of which scores some completions only (None: NaN): a
    completion neither scores is left out of its group's mean and deviation and gets no
    advantage; one scored by one function only counts that function's reward."""
    nan = float("nan")
    per_function = torch.tensor(
        [
            [1.0, nan], [0.0, 0.5], [nan, nan], [1.0, 1.0],  # group 1: one unscored
            [nan, 0.2], [0.0, nan], [1.0, 0.0], [nan, nan],  # group 2: one unscored
            [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5],  # group 3: rewarded alike
        ]
    )  # fmt: skip
    weights = torch.tensor([1.0, 0.5])
    expected = trl_advantages(per_function, weights, 4, scale)
    functions = [SimpleNamespace(weight=float(w)) for w in weights]
    rewards = weighted_rewards(per_function, functions)  # type: ignore[arg-type]
    got = group_advantages(rewards, 4, scale)
    torch.testing.assert_close(got.values, expected, rtol=1e-6, atol=1e-7)
    assert got.values[[2, 7]].eq(0).all()
    assert int(got.unscored) == 2


def test_batch_scaling_divides_by_the_deviation_of_the_whole_steps_rewards(tmp_path, monkeypatch):
    """`scale_rewards: batch` over two micro-batches of a step: their advantages are TRL's for
    the step's sixteen completions as one generation batch, not each micro-batch's own."""
    import tuneforge.train.objectives.grpo as grpo_module
    from tuneforge.train.objectives.rewards import RewardFunction
    from tuneforge.train.objectives.rollout import Rollout

    _, ours = models(tmp_path, 1.0)
    section = GrpoSection(num_generations=4, max_new_tokens=3, scale_rewards="batch")
    functions = [RewardFunction("given", lambda **_: [], 1.0, "grpo.rewards.0.function")]
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    objective = GrpoObjective(ours, section, tokenizer, functions, None, accumulation=2, seed=0)
    nan = float("nan")
    given = torch.tensor(
        [[1.0], [0.0], [0.0], [nan], [0.5], [0.5], [0.5], [0.5],  # micro-batch 1
         [3.0], [1.0], [2.0], [nan], [0.0], [4.0], [1.0], [2.0]]  # micro-batch 2: wider
    )  # fmt: skip
    halves = iter([given[:8], given[8:]])
    monkeypatch.setattr(objective, "_scored", lambda *_: next(halves))
    monkeypatch.setattr(
        grpo_module,
        "sample",
        lambda model, prompts, group, *_: Rollout(
            [p for p in prompts for _ in range(group)], [[7, 8, 9]] * (len(prompts) * group), 0.0
        ),
    )
    read = PackedBatch(
        torch.arange(14), torch.tensor([IGNORE_INDEX] * 4 + [5, 6, IGNORE_INDEX] * 1 + [IGNORE_INDEX] * 4 + [12, 13, IGNORE_INDEX]),
        PackedSequences.from_lengths([7, 7]), 4,
    )  # fmt: skip
    made = [objective.make_batch(read) for _ in range(2)]
    got = torch.cat([batch.extras["advantages"] for batch in made])
    expected = trl_advantages(given, torch.ones(1), 4, "batch")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    alone = group_advantages(weighted_rewards(given[:8], functions), 4, "batch").values
    assert not torch.allclose(got[:8], alone)  # a micro-batch's own deviation differs


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("split", ["accumulation", "ranks"])
def test_a_step_of_two_parts_is_trls(tmp_path, loss_type, split):
    """The six completions as two micro-batches of one step (TRL: gradient accumulation over a
    generation batch of both), or as two ranks' halves (TRL: each rank's loss, the gradients
    averaged as DDP averages them), at temperature 0.7 with the KL term: the step's gradient
    is TRL's. Both normalise over the step: the completions (grpo, dr_grpo; equal in number in
    each part, where TRL's mean of the parts' means is the mean) or every token (dapo)."""
    hf, ours = models(tmp_path, 0.7)
    inputs = completions()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    stub = trl_stub(hf, loss_type, beta=0.04)
    with torch.no_grad():
        policy, _, _ = stub._get_per_token_logps_and_entropies(hf, ids, mask, MAX_NEW_TOKENS)
    generator = torch.Generator().manual_seed(2)
    old = policy + 0.3 * torch.randn(policy.shape, generator=generator)
    ref = policy + 0.2 * torch.randn(policy.shape, generator=generator)
    advantages = torch.tensor([1.1, -0.4, -0.7, 0.5, -1.3, 0.8])
    whole = dict(inputs, advantages=advantages, old_per_token_logps=old, ref_per_token_logps=ref)
    whole["num_items_in_batch"] = inputs["completion_mask"].sum().float()
    if split == "accumulation":
        stub.current_gradient_accumulation_steps = stub.args.steps_per_generation = 2
    else:
        stub.accelerator.num_processes = 2
    objective = grpo_objective(ours, loss_type, 0.04, 0.7)
    loss_sums, units = [], 0
    for part in (slice(0, 3), slice(3, 6)):
        trl_part = {k: v[part] if v.dim() else v for k, v in whole.items()}
        trl_loss = trl_grpo.GRPOTrainer._compute_loss(stub, hf, trl_part)
        (trl_loss / 2 if split == "ranks" else trl_loss).backward()  # DDP's mean over ranks
        lengths = LENGTHS[part]
        batch, where = packed(trl_part, lengths)
        batch.extras = rollout_extras(advantages[part]) | {
            "old_logps": flat(old[part], batch, where, lengths),
            "ref_logps": flat(ref[part], batch, where, lengths),
        }
        loss_sums.append(objective(batch).loss_sum)
        units += objective.units(batch)
    (sum(loss_sums) / units).backward()  # the step's sum over both parts, over their units
    hf_params = dict(hf.named_parameters())
    adapter = adapter_for(ours.args.family)
    for name, param in ours.named_parameters():
        expected = hf_params[hf_name_of(adapter, name)].grad
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-7, msg=name)
