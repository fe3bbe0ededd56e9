"""Adapters on disk in the PEFT layout: `adapter_config.json` + `adapter_model.safetensors`.

Keys follow PEFT, so `peft`, vLLM and others load what we save, and adapters made by `peft`
load here:
- a linear: `base_model.model.<HF module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r];
- an expert bank, as PEFT's `target_parameters` on transformers' stacked experts:
  `base_model.model.<HF bank>.lora_A.weight` [E·r, in] (expert-major) and `.lora_B.weight`
  [out, r·E] (expert-minor); when both `gate_up_proj` and `down_proj` are adapted, the gate_up
  adapter sits one `base_layer.` deeper, as PEFT nests the two wrappers;
- DoRA's magnitude of a linear: `base_model.model.<HF module>.lora_magnitude_vector` [out];
- a module trained in full (`modules_to_save`): `base_model.model.<HF module>.weight`.
"""

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open

from tuneforge.config.sections.lora import LoraSection
from tuneforge.errors import TuneforgeError
from tuneforge.file_modes import save_tensors
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import gathered
from tuneforge.peft.apply import applied_lora, apply_lora, full_modules, lora_modules
from tuneforge.peft.decomposed_init import METHODS as DECOMPOSED
from tuneforge.peft.decomposed_init import against_original_base, saved_rank_and_alpha
from tuneforge.peft.expert_lora import ExpertLoRA
from tuneforge.peft.lora import LoRALinear
from tuneforge.peft.targets import BANK_PROJECTIONS, candidates

CONFIG_FILE = "adapter_config.json"
MAGNITUDE = "lora_magnitude_vector"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


log = logging.getLogger(__name__)


class AdapterError(TuneforgeError):
    """An adapter directory that does not fit the model it is loaded into."""


Adapter = LoRALinear | ExpertLoRA


def adapter_keys(model: Decoder) -> dict[str, Adapter]:
    """PEFT key stem (without `.lora_A.weight`) of every adapter on the model."""
    family = adapter_for(model.args.family)
    stems: dict[str, Adapter] = {}
    banks: dict[str, dict[str, ExpertLoRA]] = {}
    for name, module in lora_modules(model).items():
        if isinstance(module, LoRALinear):
            stems[PEFT_PREFIX + family.module_to_hf(name)] = module
        else:
            bank, _, projection = name.rpartition(".adapters.")
            banks.setdefault(bank, {})[projection] = module
    hf_banks = {c.module: c.hf_name.rpartition(".")[0] for c in candidates(model, family)}
    for bank, adapters in banks.items():
        present = [p for p in BANK_PROJECTIONS if p in adapters]
        for depth, projection in enumerate(present):
            nesting = "base_layer." * (len(present) - 1 - depth)
            stems[f"{PEFT_PREFIX}{hf_banks[bank]}.{nesting}".rstrip(".")] = adapters[projection]
    return stems


def to_peft(adapter: Adapter, kind: str) -> torch.Tensor:
    """The tensor PEFT keeps: for a linear initialised from its base, its update against the
    original base (`decomposed_init.against_original_base`)."""
    if isinstance(adapter, LoRALinear):
        lora_A, lora_B = against_original_base(adapter, gathered)
        return lora_A if kind == "A" else lora_B
    weight = gathered((adapter.lora_A if kind == "A" else adapter.lora_B).detach())
    experts = adapter.num_experts
    weight = weight.expand(experts, -1, -1)
    if kind == "A":  # [E, r, in] -> [E*r, in]
        return weight.reshape(-1, weight.shape[-1])
    return weight.permute(1, 2, 0).reshape(weight.shape[1], -1)  # [E, out, r] -> [out, r*E]


def from_peft(adapter: Adapter, kind: str, tensor: torch.Tensor) -> torch.Tensor:
    """The PEFT tensor in our parameter's shape; raises AdapterError when it cannot fit."""
    target = adapter.lora_A if kind == "A" else adapter.lora_B
    if isinstance(adapter, ExpertLoRA):
        experts, rank = adapter.num_experts, adapter.rank
        if kind == "A" and tensor.ndim == 2 and tensor.shape[0] == experts * rank:
            tensor = tensor.reshape(experts, rank, -1)
        elif kind == "B" and tensor.ndim == 2 and tensor.shape[1] == experts * rank:
            tensor = tensor.reshape(tensor.shape[0], rank, experts).permute(2, 0, 1)
        if adapter.shared and tensor.shape[0] == experts:
            tensor = tensor[:1]
    if tensor.shape != target.shape:
        raise AdapterError(f"shape {tuple(tensor.shape)} does not fit {tuple(target.shape)}")
    return tensor


def _target_names(stems: dict[str, Adapter], model: Decoder) -> tuple[list, list]:
    """(target_modules, target_parameters) as PEFT matches them: leaf names when every module
    with that leaf is adapted, full names otherwise."""
    family = adapter_for(model.args.family)
    every = candidates(model, family)
    linears = sorted(
        s.removeprefix(PEFT_PREFIX) for s, a in stems.items() if isinstance(a, LoRALinear)
    )
    leaves = {name.rsplit(".", 1)[-1] for name in linears}
    all_of_leaf = all(
        c.hf_name in linears for c in every if c.projection is None and c.leaf in leaves
    )
    modules = sorted(leaves) if all_of_leaf else linears
    parameters = []
    for name, module in lora_modules(model).items():
        if isinstance(module, ExpertLoRA):
            bank, _, projection = name.rpartition(".adapters.")
            hf_bank = next(c.hf_name for c in every if c.module == bank).rpartition(".")[0]
            parameters.append(f"{hf_bank}.{projection}")
    return modules, sorted(parameters)


def _saved(adapter: Adapter, attribute: str) -> float:
    """The rank or alpha an adapter is saved with (doubled for one initialised from its base)."""
    if isinstance(adapter, LoRALinear):
        return saved_rank_and_alpha(adapter)[0 if attribute == "rank" else 1]
    return getattr(adapter, attribute)


def _patterns(stems: dict[str, Adapter], attribute: str, default: float) -> dict[str, float]:
    """PEFT's rank_pattern / alpha_pattern: full module names whose value is not the default."""
    found: dict[str, float] = {}
    for stem, adapter in stems.items():
        value = _saved(adapter, attribute)
        module = stem.removeprefix(PEFT_PREFIX).split(".base_layer")[0]
        if module in found and found[module] != value:
            raise AdapterError(
                f"{module}: PEFT keeps one {attribute} per expert bank, but its gate_up and down "
                f"adapters have {found[module]} and {value}"
            )
        if value != default:
            found[module] = value
    return found


PEFT_EXPERT_NAMES = {
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
    "deepseek_v2": ("gate_proj", "up_proj", "down_proj"),
    "mixtral": ("w1", "w2", "w3"),
}
"""Target names PEFT (with transformers 5) takes for a MoE family's experts, wherever they are."""


def _warn_where_peft_reads_them_as_experts(model: Decoder, target_modules: list[str]) -> None:
    names = PEFT_EXPERT_NAMES.get(model.args.family, ())
    dense = sorted({t for t in target_modules if t.rsplit(".", 1)[-1] in names})
    if dense:
        log.warning(
            "the adapter adapts %s of dense or shared-expert MLPs: PEFT reads those names as the "
            "experts' projections on a %s model and cannot load it (tuneforge can); leave them "
            "out of lora.target_modules for an adapter PEFT loads",
            ", ".join(dense), model.args.family,
        )  # fmt: skip


def save_adapter(
    model: Decoder, out_dir: str | os.PathLike, base_model: str = "", write: bool = True
) -> None:
    """Write the model's adapters (and `modules_to_save`) in the PEFT layout. Under FSDP every
    rank calls it (to gather the shards) and one writes (`write`)."""
    out_dir = Path(out_dir)
    stems = adapter_keys(model)
    if not stems:
        raise AdapterError("the model has no LoRA modules to save")
    lora = applied_lora(model)
    tensors = {}
    for stem, adapter in stems.items():
        for kind in ("A", "B"):
            tensors[f"{stem}.lora_{kind}.weight"] = to_peft(adapter, kind).cpu().contiguous()
        magnitude = getattr(adapter, "lora_magnitude", None)
        if magnitude is not None:
            tensors[f"{stem}.{MAGNITUDE}"] = gathered(magnitude.detach()).cpu().contiguous()
    saved = full_modules(model, lora.modules_to_save)
    for name, hf_name in saved.items():
        weight = gathered(_weight_of(model, name).detach())
        tensors[f"{PEFT_PREFIX}{hf_name}.weight"] = weight.cpu().contiguous()
    if not write:
        return
    target_modules, target_parameters = _target_names(stems, model)
    _warn_where_peft_reads_them_as_experts(model, target_modules)
    rank, alpha = lora.rank, lora.alpha
    if lora.init in DECOMPOSED:  # saved as the rank-2r LoRA of its update on the original base
        rank, alpha = 2 * rank, alpha * (2**0.5 if lora.use_rslora else 2.0)
    ranks = _patterns(stems, "rank", rank)
    alphas = _patterns(stems, "alpha", alpha)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        # PEFT refuses dropout on expert parameters; it only matters in training anyway
        "lora_dropout": 0.0 if target_parameters else lora.dropout,
        "target_modules": target_modules,
        "target_parameters": target_parameters or None,
        "rank_pattern": ranks,
        "alpha_pattern": alphas,
        "use_rslora": lora.use_rslora,
        "modules_to_save": sorted(saved.values()) or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": lora.use_dora,
        "init_lora_weights": "gaussian" if lora.init == "gaussian" else True,
        "inference_mode": True,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, out_dir / WEIGHTS_FILE, metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def read_adapter_config(adapter_dir: Path) -> dict:
    config_file = adapter_dir / CONFIG_FILE
    if not config_file.is_file():
        raise AdapterError(f"{adapter_dir} has no {CONFIG_FILE}: is it a LoRA adapter directory?")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise AdapterError(f"{config_file}: invalid JSON ({error})") from None
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{config_file}: peft_type {config.get('peft_type')!r} is not LORA")
    if not (adapter_dir / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{adapter_dir} has no {WEIGHTS_FILE}")
    return config


def _peft_patterns(value) -> list[str]:
    """PEFT's target/exclude value as our patterns: a string is a regex over full names."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value == "all-linear" else [f"re:{value}"]
    return list(value)


def lora_config_of(adapter_config: dict) -> LoraSection:
    """Our LoRA configuration equivalent to a PEFT `adapter_config.json`."""

    def suffix_regex(patterns: dict | None) -> dict:
        # PEFT matches these keys as regexes ending a module name
        return {rf"re:(.*\.)?({key})": value for key, value in (patterns or {}).items()}

    return LoraSection(
        rank=adapter_config["r"],
        alpha=adapter_config["lora_alpha"],
        use_rslora=bool(adapter_config.get("use_rslora")),
        use_dora=bool(adapter_config.get("use_dora")),
        target_modules=_peft_patterns(adapter_config.get("target_modules"))
        + list(adapter_config.get("target_parameters") or []),
        exclude_modules=_peft_patterns(adapter_config.get("exclude_modules")),
        rank_pattern=suffix_regex(adapter_config.get("rank_pattern")),
        alpha_pattern=suffix_regex(adapter_config.get("alpha_pattern")),
        modules_to_save=list(adapter_config.get("modules_to_save") or []),
    )


def continue_adapter(model: Decoder, adapter_dir: Path, lora: LoraSection) -> None:
    """Start the model's adapters (made as `lora` says) from the weights in `adapter_dir`."""
    check_continues(adapter_dir, lora)
    load_adapter_weights(model, adapter_dir)
    log.info("adapters start from %s", adapter_dir)


def check_continues(adapter_dir: Path, lora: LoraSection) -> None:
    """Refuse to continue an adapter whose rank, alpha or scaling rule differs from the run's:
    its weights would load, and compute something else."""
    config = read_adapter_config(adapter_dir)
    theirs = {
        "rank": config["r"],
        "alpha": float(config["lora_alpha"]),
        "use_rslora": bool(config.get("use_rslora")),
        "use_dora": bool(config.get("use_dora")),
    }
    ours = {
        "rank": lora.rank,
        "alpha": float(lora.alpha),
        "use_rslora": lora.use_rslora,
        "use_dora": lora.use_dora,
    }
    differ = [
        f"lora.{key} {ours[key]} (the adapter's {theirs[key]})"
        for key in ours
        if ours[key] != theirs[key]
    ]
    if differ:
        raise AdapterError(
            f"lora.init_adapter {adapter_dir}: the run's {', '.join(differ)}: set them as the "
            "adapter has them"
        )


def load_adapter(
    model: Decoder, adapter_dir: str | os.PathLike, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """Put the adapter in `adapter_dir` on `model` (creating its LoRA modules from the adapter's
    config unless the model already carries matching ones) and load its weights."""
    adapter_dir = Path(adapter_dir)
    if not lora_modules(model):
        config = read_adapter_config(adapter_dir)
        apply_lora(model, lora_config_of(config), dtype=dtype)
    load_adapter_weights(model, adapter_dir)
    return model


def load_adapter_weights(model: Decoder, adapter_dir: str | os.PathLike) -> None:
    """Copy adapter tensors into a model that already carries LoRA modules of the same shape."""
    adapter_dir = Path(adapter_dir)
    stems = adapter_keys(model)
    lora = applied_lora(model)
    full = {
        f"{PEFT_PREFIX}{hf}.weight": _weight_of(model, name)
        for name, hf in full_modules(model, lora.modules_to_save).items()
    }
    seen = set()
    file = adapter_dir / WEIGHTS_FILE
    with safe_open(str(file), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
            stem, _, kind = key.rpartition(".lora_")
            tensor = handle.get_tensor(key)
            owner = stems.get(key.removesuffix(f".{MAGNITUDE}"))
            magnitude = _magnitude(owner) if owner is not None else None
            if key in full:
                target, value = full[key], tensor
            elif magnitude is not None:
                target, value = magnitude, tensor
            elif stem in stems and kind in ("A.weight", "B.weight"):
                adapter = stems[stem]
                target = adapter.lora_A if kind == "A.weight" else adapter.lora_B
                try:
                    value = from_peft(adapter, kind[0], tensor)
                except AdapterError as error:
                    raise AdapterError(f"{file}: {key}: {error}") from None
            else:
                raise AdapterError(f"{file}: tensor {key} has no place in this model")
            if value.shape != target.shape:
                raise AdapterError(
                    f"{file}: {key}: shape {tuple(value.shape)} does not fit {tuple(target.shape)}"
                )
            with torch.no_grad():
                target.copy_(value)
            seen.add(key)
    expected = [f"{stem}.lora_{kind}.weight" for stem in stems for kind in "AB"] + list(full)
    expected += [f"{stem}.{MAGNITUDE}" for stem, a in stems.items() if _magnitude(a) is not None]
    missing = [key for key in expected if key not in seen]
    if missing:
        raise AdapterError(f"{file}: no weights for {', '.join(missing[:3])}")


def _magnitude(adapter: Adapter) -> torch.Tensor | None:
    return adapter.lora_magnitude if isinstance(adapter, LoRALinear) else None


def _weight_of(model: Decoder, name: str) -> torch.Tensor:
    weight = model.get_submodule(name).weight
    assert isinstance(weight, torch.Tensor)
    return weight
