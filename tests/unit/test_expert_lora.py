"""LoRA on MoE expert banks: the grouped path equals the per-expert loop and the merged weights,
gradients reach only adapters, and adapters travel to and from `peft` (target_parameters)."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

import tuneforge
from tests.helpers import save_tiny_model
from tuneforge.models.args import MoEArgs
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.models.moe import MoE
from tuneforge.peft.adapter_io import read_adapter_config
from tuneforge.peft.apply import lora_modules
from tuneforge.peft.expert_lora import ExpertLoRA

TOKENS = torch.randint(0, 128, (23,), generator=torch.Generator().manual_seed(2))
BANKS = ["experts.gate_up_proj", "experts.down_proj"]
ATTENTION = {  # two attention projections of each family
    "qwen3_moe": ["q_proj", "v_proj"],
    "mixtral": ["q_proj", "v_proj"],
    "deepseek_v2": ["q_proj", "kv_b_proj"],
}


def randomise(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for module in lora_modules(model).values():
        with torch.no_grad():
            module.lora_B.normal_(0, 0.2, generator=generator)


def logits(model):
    with torch.no_grad():
        return model(TOKENS[None])[0]


def adapted_moe(implementation, shared=False, rank=4):
    torch.manual_seed(0)
    moe = MoE(16, MoEArgs(num_experts=6, top_k=2, expert_ffn_dim=24), implementation)
    for param in moe.parameters():
        torch.nn.init.normal_(param, std=0.2)
    for projection, (out, inp) in {"gate_up_proj": (48, 16), "down_proj": (16, 24)}.items():
        adapter = ExpertLoRA(6, inp, out, rank, 2.0 * rank, shared=shared)
        with torch.no_grad():
            adapter.lora_B.normal_(0, 0.3)
        moe.experts.adapters[projection] = adapter
    return moe


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("rank", [4, 3])  # 3: not 16-byte aligned, the grouped GEMM falls back
def test_grouped_expert_lora_equals_the_per_expert_loop(shared, rank):
    grouped, loop = adapted_moe("grouped", shared, rank), adapted_moe("loop", shared, rank)
    loop.load_state_dict(grouped.state_dict())
    x = torch.randn(40, 16)
    x_grouped, x_loop = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.testing.assert_close(grouped(x_grouped), loop(x_loop))
    grouped(x_grouped).square().sum().backward()
    loop(x_loop).square().sum().backward()
    torch.testing.assert_close(x_grouped.grad, x_loop.grad)
    for (name, a), (_, b) in zip(
        grouped.experts.adapters.named_parameters(),
        loop.experts.adapters.named_parameters(),
        strict=True,
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-4, msg=name)


def test_expert_lora_equals_the_experts_with_merged_weights():
    moe = adapted_moe("grouped")
    x = torch.randn(40, 16)
    with torch.no_grad():
        adapted = moe(x)
        reference = MoE(16, MoEArgs(num_experts=6, top_k=2, expert_ffn_dim=24), "loop")
        reference.load_state_dict(moe.state_dict(), strict=False)
        gate_up = moe.experts.adapters["gate_up_proj"]
        down = moe.experts.adapters["down_proj"]
        for e in range(6):  # W_e + scale * B_e A_e, one expert at a time
            delta = gate_up.scaling * gate_up.lora_B[e] @ gate_up.lora_A[e]
            reference.experts.gate_up_proj[e] += delta  # gate rows, then up rows
            reference.experts.down_proj[e] += down.scaling * down.lora_B[e] @ down.lora_A[e]
        torch.testing.assert_close(adapted, reference(x), rtol=1e-5, atol=1e-5)


def test_model_with_expert_lora_trains_only_adapters_and_merges(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": ["q_proj", *BANKS], "rank": 4})
    randomise(model)
    model(TOKENS[None]).square().mean().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in with_grad)
    assert any("experts.adapters.gate_up_proj.lora_A" in n for n in with_grad)
    assert not any("router" in n for n in with_grad)
    adapted = logits(model)
    tuneforge.merge_lora(model)
    assert not lora_modules(model)
    torch.testing.assert_close(logits(model), adapted, atol=1e-5, rtol=1e-4)


def test_shared_expert_adapters_are_one_adapter(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": BANKS, "rank": 4, "share_expert_adapters": True})
    banks = [m for m in lora_modules(model).values() if isinstance(m, ExpertLoRA)]
    assert banks and all(m.lora_A.shape[0] == 1 and m.lora_B.shape[0] == 1 for m in banks)
    randomise(model)
    delta = banks[0].delta_weight()
    assert delta.shape[0] == 8 and torch.equal(delta[0], delta[5])


@pytest.mark.parametrize(
    ("family", "shared"), [("qwen3_moe", False), ("qwen3_moe", True), ("mixtral", False)]
)
def test_our_expert_adapter_loads_in_peft_with_the_same_logits(tmp_path, family, shared):
    hf_model = save_tiny_model(tmp_path / "base", family)
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    lora = {"target_modules": [*ATTENTION[family], *BANKS], "rank": 4, "alpha": 8}
    tuneforge.apply_lora(model, lora | {"share_expert_adapters": shared})
    randomise(model, seed=1)
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    config = read_adapter_config(tmp_path / "adapter")
    assert config["target_parameters"] == [
        f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("down_proj", "gate_up_proj")
    ]
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = peft_model(TOKENS[None]).logits[0]
    torch.testing.assert_close(logits(model), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v2"])
def test_peft_expert_adapter_loads_here_with_the_same_logits(tmp_path, family):
    hf_model = save_tiny_model(tmp_path / "base", family)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=ATTENTION[family][-1:],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(hf_model, config).eval()
    with torch.no_grad():
        expected = peft_model(TOKENS[None]).logits[0]
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.load_adapter(model, tmp_path / "peft_adapter")
    sparse = sum(1 for layer in model.layers if isinstance(layer.mlp, MoE))
    assert len([m for m in lora_modules(model).values() if isinstance(m, ExpertLoRA)]) == 2 * sparse
    torch.testing.assert_close(logits(model), expected, atol=1e-5, rtol=1e-4)
