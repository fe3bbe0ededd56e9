"""PiSSA and OLoRA initialisations against `peft`'s: the same A, B and residual base weights; the
model starts where it was; a trained adapter saved as the rank-2r LoRA of its update on the
original base loads in PEFT onto the original model with our logits, and here again."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

import tuneforge
from tests.helpers import TARGETS, our_logits, peft_logits, save_tiny_llama, save_tiny_model
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.adapter_io import read_adapter_config
from tuneforge.peft.apply import lora_modules
from tuneforge.peft.targets import LoraTargetError


def hf_name(name: str) -> str:
    return "model." + name.replace("attn.", "self_attn.")


@pytest.mark.parametrize("method", ["pissa", "olora"])
@pytest.mark.parametrize("use_rslora", [False, True])
def test_initialisation_matches_peft_and_starts_where_the_model_was(tmp_path, method, use_rslora):
    hf_model = save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    before = our_logits(model)
    lora = {"target_modules": TARGETS, "rank": 4, "alpha": 8, "init": method,
            "use_rslora": use_rslora}  # fmt: skip
    tuneforge.apply_lora(model, lora)
    torch.testing.assert_close(our_logits(model), before, atol=1e-4, rtol=1e-4)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=method,
                        use_rslora=use_rslora)  # fmt: skip
    peft_model = get_peft_model(hf_model, config)
    theirs = dict(peft_model.named_parameters())
    for name, adapter in lora_modules(model).items():
        stem = f"base_model.model.{hf_name(name)}"
        torch.testing.assert_close(adapter.lora_A, theirs[f"{stem}.lora_A.default.weight"])
        torch.testing.assert_close(adapter.lora_B, theirs[f"{stem}.lora_B.default.weight"])
        residual = theirs[f"{stem}.base_layer.weight"]
        torch.testing.assert_close(adapter.base.weight, residual, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("method", ["pissa", "olora"])
def test_a_trained_decomposed_adapter_is_saved_against_the_original_base(tmp_path, method):
    hf_model = save_tiny_llama(tmp_path / "base")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    lora = {"target_modules": ["q_proj", "v_proj", "down_proj"], "rank": 4, "alpha": 8,
            "init": method, "rank_pattern": {"down_proj": 2}}  # fmt: skip
    tuneforge.apply_lora(model, lora)
    generator = torch.Generator().manual_seed(0)
    for adapter in lora_modules(model).values():  # as if trained
        with torch.no_grad():
            adapter.lora_A.add_(0.05 * torch.randn(adapter.lora_A.shape, generator=generator))
            adapter.lora_B.add_(0.05 * torch.randn(adapter.lora_B.shape, generator=generator))
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    saved = read_adapter_config(tmp_path / "adapter")
    assert saved["r"] == 8 and saved["lora_alpha"] == 16 and saved["init_lora_weights"] is True
    assert saved["rank_pattern"] == {"model.layers.0.mlp.down_proj": 4,
                                     "model.layers.1.mlp.down_proj": 4}  # fmt: skip
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-4, rtol=1e-4)
    again = tuneforge.load_adapter(
        load_hf_model(tmp_path / "base", "float32", "sdpa"), tmp_path / "adapter"
    )
    torch.testing.assert_close(our_logits(again), our_logits(model), atol=1e-4, rtol=1e-4)


def test_decomposing_expert_banks_is_refused(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    with pytest.raises(LoraTargetError, match="decomposing expert banks"):
        tuneforge.apply_lora(model, {"target_modules": ["experts.down_proj"], "init": "pissa"})
