"""AdamW over accurate copies of bf16 weights against torch's AdamW on fp32 weights (the
oracle), and the checkpoint layout that carries them."""

import copy

import pytest
import torch
from torch import nn

from tuneforge.config.sections.train import TrainSection
from tuneforge.precision.trained_weights import TrainedWeights
from tuneforge.train.master_adamw import MasterAdamW, accurate_weights, split_accurate_weights
from tuneforge.train.optim import build_optimizer

SETTINGS = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def weights(seed: int = 0) -> list[nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(48, 32), (32,)]
    return [nn.Parameter(0.02 * torch.randn(*s, generator=generator)) for s in shapes]


def run(optimizer, params, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
        optimizer.step()


def bf16_copies(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return [nn.Parameter(p.detach().bfloat16()) for p in params]


def oracle(params: list[nn.Parameter], steps: int) -> list[nn.Parameter]:
    """torch's fused AdamW on fp32 weights that start at the bf16 values, fed the bf16 gradients."""
    reference = [nn.Parameter(p.detach().bfloat16().float()) for p in params]
    optimizer = torch.optim.AdamW(reference, fused=True, **SETTINGS)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in reference:
            p.grad = torch.randn(p.shape, generator=generator).bfloat16().float()
        optimizer.step()
    return reference


def test_master_weights_are_fp32_adamw_exactly_and_the_weights_their_rounding():
    params = bf16_copies(weights())
    optimizer = MasterAdamW(params, update="master", **SETTINGS)
    run(optimizer, params, 50)
    for param, expected in zip(params, oracle(weights(), 50), strict=True):
        master = optimizer.state[param]["master"]
        assert (
            master.dtype == torch.float32
            and optimizer.state[param]["exp_avg"].dtype == torch.float32
        )
        assert torch.equal(master, expected.detach())
        assert torch.equal(param.detach(), master.bfloat16())


def test_pure_bf16_loses_small_updates_that_compensated_ones_keep():
    """lr 1e-4 on weights of ~0.02: each update is about a quarter of a bf16 step."""
    expected = oracle(weights(), 100)
    pure_params = bf16_copies(weights())
    run(torch.optim.AdamW(pure_params, fused=True, **SETTINGS), pure_params, 100)
    compensated_params = bf16_copies(weights())
    compensated = MasterAdamW(compensated_params, update="compensated", **SETTINGS)
    run(compensated, compensated_params, 100)
    start = [p.detach().bfloat16() for p in weights()]
    for before, pure, param, reference in zip(
        start, pure_params, compensated_params, expected, strict=True
    ):
        moved = (reference.detach() - before.float()).abs().mean()
        pure_error = (pure.detach().float() - reference.detach()).abs().mean()
        remainder = compensated.state[param]["compensation"]
        value = param.detach().float() + remainder.float()
        assert remainder.dtype == torch.bfloat16
        assert pure_error > 0.3 * moved  # a large share of the way lost to rounding
        assert (value - reference.detach()).abs().mean() < 0.02 * moved


def test_a_non_finite_step_changes_nothing():
    params = bf16_copies(weights())
    optimizer = MasterAdamW(params, **SETTINGS)
    run(optimizer, params, 3)
    before = [
        (p.detach().clone(), {k: v.clone() for k, v in optimizer.state[p].items()}) for p in params
    ]
    optimizer.found_inf = torch.ones(())  # type: ignore[attr-defined]
    run(optimizer, params, 1, seed=7)
    for param, (value, state) in zip(params, before, strict=True):
        assert torch.equal(param.detach(), value)
        for key, tensor in state.items():
            assert torch.equal(optimizer.state[param][key], tensor), key


@pytest.mark.parametrize("update", ["master", "compensated"])
def test_loading_a_state_dict_keeps_the_fp32_state_and_continues_exactly(update):
    params = bf16_copies(weights())
    optimizer = MasterAdamW(params, update=update, **SETTINGS)
    run(optimizer, params, 5)
    saved = copy.deepcopy(optimizer.state_dict())  # as read from a checkpoint: no shared tensors
    resumed_params = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = MasterAdamW(resumed_params, update=update, **SETTINGS)
    resumed.load_state_dict(saved)
    for param in resumed_params:
        for key in ("master", "exp_avg", "exp_avg_sq"):
            if key in resumed.state[param]:
                assert resumed.state[param][key].dtype == torch.float32
    run(optimizer, params, 5, seed=3)
    run(resumed, resumed_params, 5, seed=3)
    for a, b in zip(params, resumed_params, strict=True):
        assert torch.equal(a.detach(), b.detach())


@pytest.mark.parametrize("update", ["master", "compensated"])
def test_a_checkpoint_holds_the_accurate_weight_and_splits_it_back(update):
    params = bf16_copies(weights())
    optimizer = MasterAdamW(params, update=update, **SETTINGS)
    run(optimizer, params, 20)
    names = ["w", "b"]
    model_state = dict(zip(names, (p.detach() for p in params), strict=True))
    live = optimizer.state_dict()["state"]
    optimizer_state = {"state": {name: live[i] for i, name in enumerate(names)}}
    parts = accurate_weights(model_state, optimizer_state)
    key = "master" if update == "master" else "compensation"
    for name, param in zip(names, params, strict=True):
        state = optimizer.state[param]
        accurate = (
            state["master"] if update == "master" else param.float() + state["compensation"].float()
        )
        assert model_state[name].dtype == torch.float32
        assert torch.equal(model_state[name], accurate)
        assert key not in optimizer_state["state"][name] and key in state  # the live state kept
    split_accurate_weights(model_state, optimizer_state, parts)
    for name, param in zip(names, params, strict=True):
        assert torch.equal(optimizer_state["state"][name][key], optimizer.state[param][key])


def test_the_optimizer_keeps_masters_only_where_16_bit_weights_train():
    train = TrainSection(max_steps=1)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).to(torch.bfloat16)
    master = TrainedWeights.of(True, "bfloat16")
    assert isinstance(build_optimizer(model, train, torch.device("cpu"), master), MasterAdamW)
    pure = TrainedWeights.of(False, "bfloat16")
    assert type(build_optimizer(model, train, torch.device("cpu"), pure)) is torch.optim.AdamW
    fp32 = nn.Linear(8, 8)  # LoRA adapters, an fp32 model: nothing to keep beside them
    assert type(build_optimizer(fp32, train, torch.device("cpu"), master)) is torch.optim.AdamW


def test_each_kind_says_what_it_keeps():
    assert TrainedWeights.of(True, "bfloat16").describe() == (
        "fp32 master, bf16 compute, fp32 AdamW states"
    )
    assert "FSDP2 shards" in TrainedWeights.of(True, "bfloat16").describe(sharded=True)
    assert TrainedWeights.of(True, "bfloat16").fp32_shards(True)
    assert not TrainedWeights.of("compensated", "bfloat16").fp32_shards(True)
    assert TrainedWeights.of(True, "float32").kind == "full"
    assert "lost" in TrainedWeights.of(False, "bfloat16").describe()


def test_a_bf16_second_moment_never_decays_where_the_masters_does():
    """beta2 = 0.999: 0.999·v rounds back to v in bf16, so after one large gradient pure bf16's
    AdamW keeps dividing by it; the fp32 moment decays as the formula says."""
    settings = dict(lr=0.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    pure = nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    master = nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    optimizers = [
        torch.optim.AdamW([pure], fused=True, **settings),
        MasterAdamW([master], **settings),
    ]
    for step in range(501):
        for param, optimizer in zip((pure, master), optimizers, strict=True):
            param.grad = torch.full((64,), 1.0 if step == 0 else 0.01, dtype=torch.bfloat16)
            optimizer.step()
    expected = 0.001 * 0.999**500 + 0.001 * 0.01**2 * sum(0.999**k for k in range(500))
    assert optimizers[0].state[pure]["exp_avg_sq"][0].item() == pytest.approx(0.001, rel=1e-3)
    assert optimizers[1].state[master]["exp_avg_sq"][0].item() == pytest.approx(expected, rel=1e-3)
