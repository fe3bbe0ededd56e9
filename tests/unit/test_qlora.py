"""QLoRA against transformers + bitsandbytes + `peft` on the CPU: our 4-bit base holds the codes
bitsandbytes makes; an adapter trained on it loads in PEFT onto the bitsandbytes-quantised
transformers model with our logits and one backward's gradients, and PEFT's loads here; the
export merges into the dequantised base; the configuration refuses what cannot be."""

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import tuneforge
from tests.cli_runs import REPO
from tests.helpers import (
    TARGETS,
    TOKENS,
    issues_of,
    our_logits,
    randomise_adapters,
    save_tiny_llama,
)
from tuneforge.config import ConfigError, load_config
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.peft.apply import lora_modules
from tuneforge.precision.apply import quantize_frozen_base
from tuneforge.precision.bnb4bit import Bnb4bitLinear


def bnb_logits(peft_model) -> torch.Tensor:
    """In training mode (dropout 0: the same function): in eval mode bitsandbytes' CPU kernel
    repacks the weights with bf16 scales, an approximation of its own."""
    peft_model.train()
    return peft_model(TOKENS[None]).logits[0]


def bnb_model(directory, quant_type: str, double_quant: bool):
    config = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type,
        bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.float32,
    )  # fmt: skip
    return AutoModelForCausalLM.from_pretrained(
        directory, quantization_config=config, device_map="cpu", dtype=torch.float32
    )


@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", True), ("fp4", False)])
def test_our_qlora_adapter_loads_in_peft_on_the_bitsandbytes_model(
    tmp_path, quant_type, double_quant
):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)  # bitsandbytes: blocks of 64
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": TARGETS, "rank": 4, "alpha": 8})
    report = quantize_frozen_base(model, quant_type, double_quant)
    assert len([m for m in model.modules() if isinstance(m, Bnb4bitLinear)]) == 14
    assert report.weight_bytes < 0.2 * sum(  # 4 bits and their scales, against fp32
        m.base.in_features * m.base.out_features * 4 for m in lora_modules(model).values()
    )
    randomise_adapters(model)
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    theirs = bnb_model(tmp_path / "base", quant_type, double_quant)
    peft_model = PeftModel.from_pretrained(theirs, tmp_path / "adapter", is_trainable=True)
    ours, their_logits = model(TOKENS[None])[0], bnb_logits(peft_model)
    torch.testing.assert_close(ours, their_logits, atol=1e-5, rtol=1e-4)
    ours.logsumexp(-1).sum().backward()
    their_logits.logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    for name, adapter in lora_modules(model).items():
        stem = "model." + name.replace("attn.", "self_attn.")
        for ours, kind in ((adapter.lora_A, "A"), (adapter.lora_B, "B")):
            key = next(k for k in grads if k.endswith(f"{stem}.lora_{kind}.default.weight"))
            torch.testing.assert_close(ours.grad, grads[key], atol=1e-4, rtol=1e-3)


def test_a_peft_qlora_adapter_loads_on_our_4bit_base(tmp_path):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)  # bitsandbytes: blocks of 64
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "down_proj"],
                        init_lora_weights=False)  # fmt: skip
    peft_model = get_peft_model(bnb_model(tmp_path / "base", "nf4", True), config)
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.load_adapter(model, tmp_path / "peft_adapter")
    quantize_frozen_base(model, "nf4", True)
    torch.testing.assert_close(
        our_logits(model), bnb_logits(peft_model).detach(), atol=1e-5, rtol=1e-4
    )


def test_a_quantized_base_needs_lora_a_single_format_and_no_dora():
    demo = REPO / "examples" / "demo.yaml"
    with pytest.raises(ConfigError) as raised:
        load_config(demo, ["model.quantize=nf4"])
    assert "lora.enabled" in issues_of(raised.value)["model.quantize"]
    qlora = ["model.quantize=nf4", "lora.enabled=true"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*qlora, "precision.fp4=e2m1"])
    assert "one format" in issues_of(raised.value)["model.quantize"]
    with pytest.raises(ConfigError) as raised:
        load_config(demo, [*qlora, "lora.use_dora=true"])
    assert "4 bits" in issues_of(raised.value)["lora.use_dora"]
    assert load_config(demo, qlora).model.double_quant


def test_a_qlora_runs_export_merges_into_the_4bit_values_it_trained_on(tmp_path, caplog):
    from tuneforge.export.merge import load_merged
    from tuneforge.export.sources import resolve_source

    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    model = load_hf_model(tmp_path / "base", "float32", "sdpa")
    tuneforge.apply_lora(model, {"target_modules": ["q_proj", "down_proj"], "rank": 4})
    quantize_frozen_base(model, "nf4", True)
    randomise_adapters(model)
    run = tmp_path / "run"
    tuneforge.save_adapter(model, run / "adapter", str(tmp_path / "base"))
    (run / "config.yaml").write_text("model:\n  quantize: nf4\n  double_quant: true\n")
    merged = load_merged(resolve_source(run))
    torch.testing.assert_close(our_logits(merged), our_logits(model), atol=1e-5, rtol=1e-4)
    assert "merged into those 4-bit values" in caplog.text
    (run / "config.yaml").write_text("model:\n  name: demo-tiny\n")  # not a QLoRA run
    original = load_merged(resolve_source(run))
    assert (our_logits(original) - our_logits(model)).abs().max() > 1e-3


@pytest.mark.parametrize("source", ["directory", "catalog"])
def test_a_base_is_quantized_on_its_way_to_the_device(tmp_path, source):
    """A model directory read, or a catalog shape made, in host memory and each projection
    quantised onto the device: the same model as quantising after loading, with the
    projections' weights only one-element placeholders until the 4-bit bases are swapped in."""
    from tuneforge.config.sections.model import ModelSection
    from tuneforge.config.sections.precision import PrecisionSection
    from tuneforge.models.api import load_model
    from tuneforge.precision.apply import apply_precision
    from tuneforge.train.build import build_model

    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    where = {"path": tmp_path / "base"} if source == "directory" else {"name": "demo-tiny"}
    section = ModelSection(**where, dtype="float32", quantize="nf4")
    staged, arrived = build_model(section, torch.device("cpu"), seed=0)
    down = staged.layers[0].mlp.down_proj
    held = down.weight
    assert down in arrived  # the 4-bit base, handed on as a value
    expected = (staged.args.dim, staged.args.ffn_dim)  # down_proj: (out, in)
    assert held.shape == expected and held.untyped_storage().nbytes() == 4
    lora = {"target_modules": ["q_proj", "down_proj"], "rank": 4}
    torch.manual_seed(0)  # the same adapters on both
    tuneforge.apply_lora(staged, lora)
    report = apply_precision(staged, PrecisionSection(), base=section, arrived=arrived)
    assert any("4-bit NF4" in line for line in report.lines)
    if source == "directory":
        loaded = load_hf_model(tmp_path / "base", "float32", "sdpa")
    else:
        loaded = load_model("demo-tiny", dtype="float32", device=torch.device("cpu"), seed=0)
    torch.manual_seed(0)
    tuneforge.apply_lora(loaded, lora)
    quantize_frozen_base(loaded, "nf4", True)
    for model in (staged, loaded):
        randomise_adapters(model, seed=4)
    torch.testing.assert_close(our_logits(staged), our_logits(loaded))


def test_a_compiled_block_traces_the_4bit_products_without_a_graph_break(tmp_path):
    """bitsandbytes' registered operators dequantise inside the compiled block: it breaks where
    the same block over a bf16 base breaks (the CPU's attention reads document lengths), no more,
    and gives the eager block's output and gradients."""
    from tuneforge.packed import PackedSequences

    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    blocks = {}
    for quantized in (False, True):
        model = load_hf_model(tmp_path / "base", "float32", "sdpa")
        tuneforge.apply_lora(model, {"target_modules": TARGETS, "rank": 4})
        if quantized:
            quantize_frozen_base(model, "nf4", True)
        randomise_adapters(model)
        blocks[quantized] = model.layers[0]
    tokens, head_dim = 16, model.args.head_dim
    rope = (torch.ones(tokens, head_dim), torch.zeros(tokens, head_dim))
    packed = PackedSequences.from_lengths([tokens])
    x = torch.randn(tokens, model.args.dim, requires_grad=True)
    breaks = {}
    for quantized, block in blocks.items():
        torch._dynamo.reset()
        breaks[quantized] = torch._dynamo.explain(block)(x, rope, packed).graph_break_count
    assert breaks[True] == breaks[False]
    block = blocks[True]
    eager = block(x, rope, packed)
    (eager_grad,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(block)(x, rope, packed)
    (compiled_grad,) = torch.autograd.grad(compiled.sum(), x)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(compiled_grad, eager_grad, atol=1e-5, rtol=1e-4)
