"""Adapters on disk in the PEFT layout: `adapter_config.json` + `adapter_model.safetensors`.

Keys follow PEFT: `base_model.model.<HF module name>.lora_A.weight`, so `peft`, vLLM and
others load what we save, and adapters made by `peft` load here.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tuneforge.models.hf.adapter import StateDictAdapter
from tuneforge.peft.lora import LoRALinear, lora_modules

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter directory that does not fit the model it is loaded into."""


def save_adapter(
    model: torch.nn.Module, out_dir: Path, family: StateDictAdapter, base_model: str = ""
) -> None:
    modules = lora_modules(model)
    if not modules:
        raise AdapterError("the model has no LoRA modules to save")
    tensors = {}
    for name, module in modules.items():
        hf_name = PEFT_PREFIX + family.module_to_hf(name)
        tensors[f"{hf_name}.lora_A.weight"] = module.lora_A.detach().cpu().contiguous()
        tensors[f"{hf_name}.lora_B.weight"] = module.lora_B.detach().cpu().contiguous()
    first = next(iter(modules.values()))
    leaves = sorted({name.rsplit(".", 1)[-1] for name in modules})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": first.rank,
        "lora_alpha": first.scaling * first.rank,
        "lora_dropout": first.dropout.p if isinstance(first.dropout, torch.nn.Dropout) else 0.0,
        "target_modules": leaves,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def read_adapter_config(adapter_dir: Path) -> dict:
    config_file = adapter_dir / CONFIG_FILE
    if not config_file.is_file():
        raise AdapterError(f"{adapter_dir} has no {CONFIG_FILE}: is it a LoRA adapter directory?")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{config_file}: peft_type {config.get('peft_type')!r} is not LORA")
    return config


def load_adapter_weights(
    model: torch.nn.Module, adapter_dir: Path, family: StateDictAdapter
) -> None:
    """Copy adapter tensors into a model that already carries LoRA modules of the same shape."""
    modules: dict[str, LoRALinear] = {
        PEFT_PREFIX + family.module_to_hf(name): module
        for name, module in lora_modules(model).items()
    }
    seen = set()
    with safe_open(str(adapter_dir / WEIGHTS_FILE), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
            stem, _, kind = key.rpartition(".lora_")
            module = modules.get(stem)
            if module is None or kind not in ("A.weight", "B.weight"):
                raise AdapterError(f"{adapter_dir / WEIGHTS_FILE}: unexpected tensor {key}")
            target = module.lora_A if kind == "A.weight" else module.lora_B
            tensor = handle.get_tensor(key)
            if tensor.shape != target.shape:
                raise AdapterError(
                    f"{key}: shape {tuple(tensor.shape)} does not fit {tuple(target.shape)}"
                )
            with torch.no_grad():
                target.copy_(tensor)
            seen.add(key)
    missing = [stem for stem in modules if f"{stem}.lora_A.weight" not in seen]
    if missing:
        raise AdapterError(f"{adapter_dir}: no weights for {missing[:3]}")
