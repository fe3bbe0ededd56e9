"""Which modules LoRA patterns select: HF names, Megatron aliases, suffixes, globs, regexes,
all-linear, exclusions — and nothing else."""

import pytest

import tuneforge
from tests.helpers import save_tiny_model
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.targets import LoraTargetError


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("moe")
    # 12 layers, layer 1 dense, the others MoE
    save_tiny_model(directory, "qwen3_moe", num_hidden_layers=12, mlp_only_layers=[1])
    return directory


def selected(moe_dir, **lora):
    model = load_hf_model(moe_dir, "float32", "sdpa")
    report = tuneforge.apply_lora(model, {"rank": 2, **lora})
    return {name for names in report.matched.values() for name in names}


def names(layers, *suffixes):
    return {f"model.layers.{i}.{s}" for i in layers for s in suffixes}


ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MOE_LAYERS = [i for i in range(12) if i != 1]


def test_megatron_aliases_select_their_hf_modules_and_expert_banks(moe_dir):
    assert selected(moe_dir, target_modules=["linear_qkv"]) == names(range(12), *ATTENTION[:3])
    assert selected(moe_dir, target_modules=["linear_proj"]) == names(range(12), ATTENTION[3])
    assert selected(moe_dir, target_modules=["linear_fc1"]) == names(
        [1], "mlp.gate_proj", "mlp.up_proj"
    ) | names(MOE_LAYERS, "mlp.experts.gate_up_proj")
    assert selected(moe_dir, target_modules=["linear_fc2"]) == names([1], "mlp.down_proj") | names(
        MOE_LAYERS, "mlp.experts.down_proj"
    )


def test_leaf_names_never_select_expert_banks_but_dotted_names_do(moe_dir):
    assert selected(moe_dir, target_modules=["down_proj"]) == names([1], "mlp.down_proj")
    assert selected(moe_dir, target_modules=["experts.gate_proj"]) == names(
        MOE_LAYERS, "mlp.experts.gate_up_proj"
    )
    assert selected(moe_dir, target_modules=["self_attn.q_proj"]) == names(range(12), ATTENTION[0])


def test_globs_take_dots_literally_and_regexes_match_whole_names(moe_dir):
    assert selected(moe_dir, target_modules=["*.layers.1.*_proj"]) == names(
        [1], *ATTENTION, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"
    )  # not layers 10 and 11
    assert selected(moe_dir, target_modules=["model.layers.1?.self_attn.q_proj"]) == names(
        [10, 11], ATTENTION[0]
    )
    assert selected(moe_dir, target_modules=[r"re:model\.layers\.(2|3)\.self_attn\.[qk]_proj"]) == (
        names([2, 3], *ATTENTION[:2])
    )


def test_all_linear_leaves_out_the_output_layer_routers_and_banks(moe_dir):
    chosen = selected(moe_dir, target_modules=["all-linear"])
    assert chosen == names(range(12), *ATTENTION) | names(
        [1], "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"
    )
    assert selected(moe_dir, target_modules=["mlp.gate"]) == names(MOE_LAYERS, "mlp.gate")


def test_exclusions_apply_after_selection(moe_dir):
    chosen = selected(
        moe_dir, target_modules=["linear_qkv"], exclude_modules=["*.layers.0.*", "k_proj"]
    )
    assert chosen == names(range(1, 12), "self_attn.q_proj", "self_attn.v_proj")


def test_modules_to_save_train_in_full_and_nothing_else_trains(moe_dir):
    model = load_hf_model(moe_dir, "float32", "sdpa")
    report = tuneforge.apply_lora(
        model, {"target_modules": ["q_proj"], "modules_to_save": ["embed_tokens", "lm_head"]}
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"embed.weight", "lm_head.weight"} <= trainable
    assert all(
        n.endswith(("lora_A", "lora_B")) for n in trainable - {"embed.weight", "lm_head.weight"}
    )
    assert report.saved_modules == ["lm_head", "model.embed_tokens"]


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"target_modules": ["q_prj"]}, r"\['q_prj'\] match nothing.*expert banks"),
        ({"target_modules": ["q_proj"], "exclude_modules": ["nope"]}, r"\['nope'\] match nothing"),
        ({"modules_to_save": ["wte"]}, "modules_to_save 'wte' matches no module"),
        ({"target_modules": ["all-linear", "lm_head"]}, "LoRA on lm_head is not supported"),
    ],
)
def test_bad_patterns_are_clear_errors(moe_dir, lora, message):
    model = load_hf_model(moe_dir, "float32", "sdpa")
    with pytest.raises(LoraTargetError, match=message):
        tuneforge.apply_lora(model, lora)


def test_default_targets_skip_what_an_all_moe_model_lacks(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = load_hf_model(tmp_path, "float32", "sdpa")
    report = tuneforge.apply_lora(model, {"rank": 2})
    assert set(report.matched) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    explicit = load_hf_model(tmp_path, "float32", "sdpa")
    with pytest.raises(LoraTargetError, match=r"\['gate_proj'\] match nothing"):
        tuneforge.apply_lora(explicit, {"rank": 2, "target_modules": ["q_proj", "gate_proj"]})


def test_mixtral_names_its_experts_w1_w2_w3(tmp_path):
    save_tiny_model(tmp_path, "mixtral")
    banks = names(range(2), "mlp.experts.gate_up_proj")
    assert selected(tmp_path, target_modules=["w1"]) == banks
    assert selected(tmp_path, target_modules=["experts.w3"]) == banks
    assert selected(tmp_path, target_modules=["w2"]) == names(range(2), "mlp.experts.down_proj")
    assert selected(tmp_path, target_modules=["all-linear"]) == names(range(2), *ATTENTION)


def test_megatron_names_select_the_latent_attention_projections(tmp_path):
    save_tiny_model(tmp_path, "deepseek_v2_q")
    assert selected(tmp_path, target_modules=["linear_kv_down_proj", "linear_q_up_proj"]) == names(
        range(2), "self_attn.kv_a_proj_with_mqa", "self_attn.q_b_proj"
    )
    assert selected(tmp_path, target_modules=["all-linear"]) == names(
        range(2),
        "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
        "self_attn.kv_b_proj", "self_attn.o_proj", "mlp.shared_experts.gate_proj",
        "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj",
    )  # fmt: skip
