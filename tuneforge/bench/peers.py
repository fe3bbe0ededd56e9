"""The peers' side: what a user would run instead, on the same shape and tokens per step —
Hugging Face transformers + PEFT (optionally patched with Liger kernels) and Unsloth (16-bit
LoRA). One sequence of the step's tokens per step, SDPA attention, fused AdamW, as
`shared/peers/*.py` measured them. Preference training's peer is TRL's DPOTrainer + PEFT on the
same pairs (`peers_trl.py`)."""

import tempfile

import torch

from tuneforge.bench.ours import workload_lora
from tuneforge.bench.timing import time_steps
from tuneforge.bench.workloads import Workload
from tuneforge.models.catalog import catalog_shape
from tuneforge.models.cost import training_flops_per_token
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.peft.selection import lora_shape

LIGER_PATCHES = {
    "llama": "apply_liger_kernel_to_llama",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",
}


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"  # the CPU for the tests only


def _args(workload: Workload):
    return catalog_shape(workload.shape).with_layers(workload.layers)


def _hf_config(workload: Workload):
    import transformers

    args = _args(workload)
    values = adapter_for(args.family).config_from_args(args, "bfloat16")
    model_type = values.pop("model_type")
    for key in ("architectures", "torch_dtype", "rope_scaling"):
        values.pop(key, None)
    config = transformers.AutoConfig.for_model(model_type, **values)
    config._attn_implementation = "sdpa"
    return config


def _peft_targets(workload: Workload) -> dict:
    """PEFT's spelling: linears by leaf name, expert banks as parameters."""
    assert workload.targets is not None
    linears = [t for t in workload.targets if not t.startswith("experts.")]
    banks = [f"mlp.{t}" for t in workload.targets if t.startswith("experts.")]
    return {"target_modules": linears} | ({"target_parameters": banks} if banks else {})


def _measure(model, workload: Workload, warmup: int, steps: int) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, workload.tokens), device=_device())

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return time_steps(step, warmup, steps)


def peer_result(workload: Workload, system: str, checkpointing: bool, timing: dict) -> dict:
    """A peer's run in the bench's result fields: one document of the step's tokens."""
    args = _args(workload)
    lora = lora_shape(workload_lora(workload), args)
    flops = workload.tokens * training_flops_per_token(args, workload.tokens, lora)
    return timing | {
        "system": system,
        "variant": "checkpointing" if checkpointing else "no checkpointing",
        "tokens_per_step": workload.tokens,
        "flops_per_step": flops,
        "gpus": 1,
        "documents_per_step": 1,
        "padding_share": 0.0,
        "is_main": True,
    }


def run_hf(workload: Workload, liger: bool, checkpointing: bool, warmup: int, steps: int) -> dict:
    import transformers

    if liger:
        import liger_kernel.transformers as liger_kernel

        getattr(liger_kernel, LIGER_PATCHES[_args(workload).family])()
    torch.manual_seed(0)
    config = _hf_config(workload)
    with torch.device(_device()):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    if workload.quantize:
        model = _reloaded_in_4bit(model, workload.quantize, checkpointing)
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if workload.targets is not None:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, use_dora=workload.dora,
            **_peft_targets(workload),
        )  # fmt: skip
        model = get_peft_model(model, lora)
    timing = _measure(model, workload, warmup, steps)
    return peer_result(workload, "hf+peft+liger" if liger else "hf+peft", checkpointing, timing)


def _reloaded_in_4bit(model, quant_type: str, checkpointing: bool):
    """QLoRA as PEFT's guide makes it: the model saved, loaded again through bitsandbytes
    (double quantisation, bf16 compute), prepared for k-bit training."""
    import transformers
    from peft import prepare_model_for_kbit_training

    directory = tempfile.mkdtemp()
    model.save_pretrained(directory)
    model_class = type(model)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )  # fmt: skip
    model = model_class.from_pretrained(
        directory, quantization_config=quantization, dtype=torch.bfloat16,
        device_map={"": _device() if _device() == "cpu" else 0}, attn_implementation="sdpa",
    )  # fmt: skip
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)


def run_unsloth(workload: Workload, checkpointing: bool, warmup: int, steps: int) -> dict:
    import transformers
    from unsloth import FastLanguageModel  # first: it patches transformers on import

    config = _hf_config(workload)
    directory = tempfile.mkdtemp()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    torch.cuda.empty_cache()
    _save_word_tokenizer(directory)
    model, _ = FastLanguageModel.from_pretrained(
        directory,
        max_seq_length=workload.tokens,
        dtype=torch.bfloat16,
        load_in_4bit=workload.quantize is not None,
        load_in_8bit=False,
        full_finetuning=workload.targets is None,
        local_files_only=True,
    )
    if workload.targets is not None:
        model = FastLanguageModel.get_peft_model(
            model,
            r=16,
            lora_alpha=32,
            lora_dropout=0,
            target_modules=[t for t in workload.targets if not t.startswith("experts.")],
            use_gradient_checkpointing="unsloth" if checkpointing else False,
            bias="none",
        )
    FastLanguageModel.for_training(model)
    timing = _measure(model, workload, warmup, steps)
    return peer_result(workload, "unsloth", checkpointing, timing)


def _save_word_tokenizer(directory: str) -> None:
    """Unsloth insists on a tokenizer beside the model; the steps feed token ids directly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    ).save_pretrained(directory)
