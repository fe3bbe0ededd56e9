"""LoRA against `peft`: adapters we save load in peft with our logits, and the reverse."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from tests.helpers import save_tiny_llama
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.adapter_io import load_adapter_weights, read_adapter_config, save_adapter
from tuneforge.peft.lora import LoraTargetError, apply_lora, lora_modules, merge_lora

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENS = torch.randint(0, 128, (21,), generator=torch.Generator().manual_seed(5))


def our_logits(model):
    with torch.no_grad():
        return model(TOKENS[None])[0]


def randomise_adapters(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for module in lora_modules(model).values():
        with torch.no_grad():
            module.lora_B.normal_(0, 0.1, generator=generator)


def test_adapter_starts_as_a_no_op_and_only_adapters_train(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    before = our_logits(model)
    report = apply_lora(model, TARGETS, rank=4, alpha=8)
    torch.testing.assert_close(our_logits(model), before)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith(("lora_A", "lora_B")) for name in trainable)
    assert len(report.matched["q_proj"]) == 2
    assert report.trainable_params == sum(
        p.numel() for n, p in model.named_parameters() if n in trainable
    )


def test_our_adapter_loads_in_peft_with_the_same_logits(tmp_path):
    hf_model = save_tiny_llama(tmp_path / "base")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    apply_lora(model, TARGETS, rank=4, alpha=16)
    randomise_adapters(model)
    save_adapter(model, tmp_path / "adapter", adapter_for("llama"), str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = peft_model(TOKENS[None]).logits[0]
    torch.testing.assert_close(our_logits(model), expected, atol=1e-5, rtol=1e-4)
    assert read_adapter_config(tmp_path / "adapter")["r"] == 4


def test_peft_adapter_loads_here_with_the_same_logits(tmp_path):
    hf_model = save_tiny_llama(tmp_path / "base")
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(hf_model, config).eval()
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    with torch.no_grad():
        expected = peft_model(TOKENS[None]).logits[0]
    adapter_config = read_adapter_config(tmp_path / "peft_adapter")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    apply_lora(
        model,
        sorted(adapter_config["target_modules"]),
        adapter_config["r"],
        adapter_config["lora_alpha"],
    )
    load_adapter_weights(model, tmp_path / "peft_adapter", adapter_for("llama"))
    torch.testing.assert_close(our_logits(model), expected, atol=1e-5, rtol=1e-4)


def test_merge_gives_the_same_logits(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    apply_lora(model, TARGETS, rank=4, alpha=8)
    randomise_adapters(model, seed=1)
    unmerged = our_logits(model)
    merge_lora(model)
    assert not lora_modules(model)
    torch.testing.assert_close(our_logits(model), unmerged, atol=1e-5, rtol=1e-4)


def test_unknown_target_lists_what_exists(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    with pytest.raises(LoraTargetError, match=r"\['qkv'\] match no linear layer.*q_proj"):
        apply_lora(model, ["q_proj", "qkv"], rank=4, alpha=8)
