"""LoRA against `peft`: adapters we save load in peft with our logits, and the reverse."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

import tuneforge
from tests.helpers import (
    TARGETS,
    our_logits,
    peft_logits,
    randomise_adapters,
    save_tiny_llama,
    save_tiny_model,
)
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.adapter_io import read_adapter_config
from tuneforge.peft.apply import lora_modules
from tuneforge.peft.targets import LoraTargetError


def test_adapter_starts_as_a_no_op_and_only_adapters_train(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    before = our_logits(model)
    report = tuneforge.apply_lora(model, {"target_modules": TARGETS, "rank": 4})
    torch.testing.assert_close(our_logits(model), before)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith(("lora_A", "lora_B")) for name in trainable)
    assert report.matched["q_proj"] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    assert report.trainable_params == sum(
        p.numel() for n, p in model.named_parameters() if n in trainable
    )


@pytest.mark.parametrize(
    "lora",
    [
        {"target_modules": TARGETS, "rank": 4, "alpha": 16},
        {"target_modules": ["q_proj", "v_proj"], "rank": 8, "alpha": 8, "use_rslora": True},
        {
            "target_modules": ["all-linear"],
            "rank": 4,
            "alpha": 8,
            "rank_pattern": {"model.layers.1.self_attn.*": 2},
            "alpha_pattern": {"down_proj": 3},
            "modules_to_save": ["lm_head", "embed_tokens"],
        },
        {"target_modules": ["re:model\\.layers\\.1\\..*_proj"], "rank": 4},
    ],
    ids=["all-projections", "rslora", "patterns-and-saved-modules", "regex-subset"],
)
def test_our_adapter_loads_in_peft_with_the_same_logits(tmp_path, lora):
    hf_model = save_tiny_llama(tmp_path / "base")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, lora)
    randomise_adapters(model)
    for name in lora.get("modules_to_save", []):
        module = model.lm_head if name == "lm_head" else model.embed
        with torch.no_grad():
            module.weight.add_(torch.randn_like(module.weight) * 0.05)
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)
    assert read_adapter_config(tmp_path / "adapter")["r"] == lora["rank"]


def test_peft_adapter_loads_here_with_the_same_logits(tmp_path):
    hf_model = save_tiny_llama(tmp_path / "base")
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"model.layers.1.self_attn.q_proj": 2},
        alpha_pattern={"v_proj": 3},
        use_rslora=True,
        modules_to_save=["lm_head"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(hf_model, config).eval()
    with torch.no_grad():
        peft_model.base_model.model.lm_head.modules_to_save["default"].weight.mul_(1.5)
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.load_adapter(model, tmp_path / "peft_adapter")
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)


def test_tied_embeddings_round_trip_through_peft(tmp_path):
    hf_model = save_tiny_model(tmp_path / "base", "llama", tie_word_embeddings=True)
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": TARGETS, "rank": 4})
    randomise_adapters(model, seed=3)
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)
    again = tuneforge.load_adapter(
        load_hf_model(tmp_path / "base", "float32", "sdpa"), tmp_path / "adapter"
    )
    torch.testing.assert_close(our_logits(again), our_logits(model))


@pytest.mark.parametrize(
    ("targets", "use_dora"),
    [(["q_proj", "v_proj"], False), (TARGETS, False), (TARGETS, True)],
    ids=["q-v", "all", "dora"],
)
def test_merge_gives_the_same_logits(tmp_path, targets, use_dora):
    """DoRA merges m / ‖W + ΔW‖ · (W + ΔW)."""
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    lora = {"target_modules": targets, "rank": 4, "alpha": 8, "use_dora": use_dora}
    tuneforge.apply_lora(model, lora)
    randomise_adapters(model, seed=1)
    unmerged = our_logits(model)
    tuneforge.merge_lora(model)
    assert not lora_modules(model)
    torch.testing.assert_close(our_logits(model), unmerged, atol=1e-5, rtol=1e-4)


def test_unknown_target_lists_what_exists(tmp_path):
    save_tiny_llama(tmp_path)
    model = load_hf_model(tmp_path, "float32", "sdpa")
    with pytest.raises(LoraTargetError, match=r"\['qkv'\] match nothing.*q_proj.*full names look"):
        tuneforge.apply_lora(model, {"target_modules": ["q_proj", "qkv"]})
    with pytest.raises(LoraTargetError, match=r"lm_head in lora\.modules_to_save"):
        tuneforge.apply_lora(model, {"target_modules": ["lm_head"]})
    with pytest.raises(LoraTargetError, match="rank_pattern 'k_proj' matches none"):
        tuneforge.apply_lora(model, {"target_modules": ["q_proj"], "rank_pattern": {"k_proj": 2}})
    assert not lora_modules(model)


def test_the_public_functions_take_paths_as_text(tmp_path):
    """Every public function that takes a path takes `str` as well as `PathLike`."""
    import inspect

    save_tiny_llama(tmp_path / "base")
    model = tuneforge.load_model(str(tmp_path / "base"), dtype="float32")
    tuneforge.apply_lora(model, {"target_modules": TARGETS, "rank": 4})
    randomise_adapters(model, seed=5)
    tuneforge.save_adapter(model, str(tmp_path / "adapter"), str(tmp_path / "base"))
    again = tuneforge.load_model(str(tmp_path / "base"), dtype="float32")
    tuneforge.load_adapter(again, str(tmp_path / "adapter"))
    torch.testing.assert_close(our_logits(again), our_logits(model))
    assert tuneforge.save_model(tuneforge.merge_lora(again), str(tmp_path / "merged")).is_dir()
    functions = [
        name for name in tuneforge.__all__ if not isinstance(getattr(tuneforge, name), type)
    ]
    for name in functions:  # a path parameter is annotated to take text
        for parameter in inspect.signature(getattr(tuneforge, name)).parameters.values():
            annotation = str(parameter.annotation)
            if "Path" in annotation:
                assert "str" in annotation, (name, parameter)


FAMILY_TARGETS = {  # PEFT takes a MoE family's MLP names for its experts': attention there
    "mistral": "all-linear",
    "gemma3_text": "all-linear",
    "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "deepseek_v2": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "deepseek_v2_q": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
}


@pytest.mark.parametrize("family", sorted(FAMILY_TARGETS))
def test_adapters_of_every_family_go_both_ways(tmp_path, family):
    """Ours into PEFT and PEFT's into ours, with the same logits."""
    targets = FAMILY_TARGETS[family]
    hf_model = save_tiny_model(tmp_path / "base", family)
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    ours = [targets] if isinstance(targets, str) else targets
    tuneforge.apply_lora(model, {"target_modules": ours, "rank": 4, "alpha": 8})
    randomise_adapters(model)
    tuneforge.save_adapter(model, tmp_path / "ours", str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "ours").eval()
    torch.testing.assert_close(our_logits(model), peft_logits(peft_model), atol=1e-5, rtol=1e-4)
    peft_model.unload()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    theirs = get_peft_model(hf_model, config).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.load_adapter(model, tmp_path / "theirs")
    torch.testing.assert_close(our_logits(model), peft_logits(theirs), atol=1e-5, rtol=1e-4)


def test_saving_what_peft_would_read_as_experts_warns(tmp_path, caplog):
    save_tiny_model(tmp_path / "base", "deepseek_v2")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": ["q_proj", "gate_proj"], "rank": 4})
    tuneforge.save_adapter(model, tmp_path / "ours", str(tmp_path / "base"))
    assert "PEFT reads those names as the experts' projections" in caplog.text
