"""QLoRA and DoRA on the GPU, bf16: our 4-bit base against transformers + bitsandbytes + `peft`
(logits and one backward's gradients, training mode), our 4-bit products inside compiled blocks
against eager ones, and DoRA against `peft`'s."""

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")

from peft import PeftModel
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import tuneforge
from tests.helpers import TARGETS, TOKENS, randomise_adapters, save_tiny_llama
from tuneforge.models.api import load_model
from tuneforge.parallel.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.peft.apply import lora_modules
from tuneforge.precision.apply import quantize_frozen_base


def _ours(directory, adapters: dict, quantized: bool):
    model = load_model(directory, dtype="bfloat16", device="cuda", attention="sdpa")
    tuneforge.apply_lora(model, adapters, dtype=torch.float32)
    if quantized:
        quantize_frozen_base(model, "nf4", True)
    randomise_adapters(model)
    return model


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("adapter", ["qlora", "dora"])
def test_adapters_match_peft_on_the_gpu(tmp_path, adapter):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    settings = {"target_modules": TARGETS, "rank": 4, "alpha": 8, "use_dora": adapter == "dora"}
    model = _ours(tmp_path / "base", settings, quantized=adapter == "qlora")
    tuneforge.save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))
    quantization = None
    if adapter == "qlora":
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(
        tmp_path / "base", quantization_config=quantization, dtype=torch.bfloat16,
        device_map={"": 0}, attn_implementation="sdpa",
    )  # fmt: skip
    peft_model = PeftModel.from_pretrained(hf, tmp_path / "adapter", is_trainable=True).train()
    tokens = TOKENS[None].cuda()
    ours, theirs = model(tokens)[0].float(), peft_model(tokens).logits[0].float()
    assert _relative(ours, theirs) < 1e-2  # bf16 products in different orders
    ours.logsumexp(-1).sum().backward()
    theirs.logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    for name, module in lora_modules(model).items():
        stem = "model." + name.replace("attn.", "self_attn.")
        key = next(k for k in grads if k.endswith(f"{stem}.lora_B.default.weight"))
        assert _relative(module.lora_B.grad, grads[key]) < 3e-2


def test_compiled_4bit_blocks_match_eager_ones(tmp_path):
    save_tiny_llama(tmp_path / "base", intermediate_size=256)
    settings = {"target_modules": TARGETS, "rank": 4, "alpha": 8}
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = _ours(tmp_path / "base", settings, quantized=True)
        wrap_blocks(model, BlockWrapping(compile=compiled))
        logits = model(TOKENS[None].cuda())[0].float()
        losses[compiled] = logits
    assert _relative(losses[True], losses[False]) < 1e-2
