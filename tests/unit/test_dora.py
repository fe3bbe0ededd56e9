"""DoRA against `peft` (`use_dora=True`): our adapter loads in PEFT and PEFT's loads here with the
same logits; one backward gives PEFT's gradients of A, B and the magnitude (merging:
`test_lora_peft.py`); the adapter starts as a no-op; expert banks and low-precision bases are refused."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

import tuneforge
from tests.cli_runs import REPO
from tests.helpers import (
    TARGETS,
    TOKENS,
    issues_of,
    our_logits,
    peft_logits,
    randomise_adapters,
    save_tiny_llama,
    save_tiny_model,
)
from tuneforge.config import ConfigError, load_config
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.apply import lora_modules
from tuneforge.peft.targets import LoraTargetError

DORA = {"target_modules": TARGETS, "rank": 4, "alpha": 8, "use_dora": True}


def test_a_dora_adapter_starts_as_a_no_op_and_trains_its_magnitude(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    before = our_logits(model)
    tuneforge.apply_lora(model, DORA)
    torch.testing.assert_close(our_logits(model), before, atol=1e-5, rtol=1e-5)
    trainable = {n.rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"lora_A", "lora_B", "lora_magnitude"}


def test_our_dora_adapter_loads_in_peft_with_the_same_logits_and_gradients(tmp_path):
    hf_model = save_tiny_llama(tmp_path / "base")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, DORA)
    randomise_adapters(model)
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter", is_trainable=True)
    peft_model.eval()
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)
    # one backward of the same loss: the gradients of every adapter tensor agree
    model(TOKENS[None])[0].float().logsumexp(-1).sum().backward()
    peft_model(TOKENS[None]).logits[0].float().logsumexp(-1).sum().backward()
    theirs = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    compared = 0
    for name, module in lora_modules(model).items():
        hf = name.replace("layers.", "model.layers.").replace("attn.", "self_attn.")
        for ours, suffix in ((module.lora_A, "lora_A.default.weight"),
                             (module.lora_B, "lora_B.default.weight"),
                             (module.lora_magnitude, "lora_magnitude_vector.default.weight")):  # fmt: skip
            key = next(k for k in theirs if k.endswith(f"{hf}.{suffix}"))
            torch.testing.assert_close(ours.grad, theirs[key], atol=1e-5, rtol=1e-4)
            compared += 1
    assert compared == 3 * len(lora_modules(model))


def test_a_peft_dora_adapter_loads_here_with_the_same_logits(tmp_path):
    hf_model = save_tiny_llama(tmp_path / "base")
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], use_dora=True,
        init_lora_weights=False,
    )  # fmt: skip
    peft_model = get_peft_model(hf_model, config).eval()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_magnitude_vector" in name:
                param.mul_(1.2)
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.load_adapter(model, tmp_path / "peft_adapter")
    assert all(m.lora_magnitude is not None for m in lora_modules(model).values())
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)


def test_dora_on_expert_banks_is_refused_naming_the_bank(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    lora = {"target_modules": ["experts.down_proj"], "rank": 4, "use_dora": True}
    with pytest.raises(LoraTargetError, match="DoRA adapts dense linears only"):
        tuneforge.apply_lora(model, lora)


def test_dora_with_a_low_precision_base_is_refused_in_the_config():
    demo = REPO / "examples" / "demo.yaml"
    dora = ["lora.enabled=true", "lora.use_dora=true"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*dora, "precision.fp8=e4m3"])
    assert "low-precision" in issues_of(raised.value)["lora.use_dora"]
    assert load_config(demo, dora).lora.use_dora
