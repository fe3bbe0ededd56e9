"""Put adapters on a model as a LoRA configuration says, freeze the rest, and take them off
again by merging."""

import contextlib
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from tuneforge.config.sections.lora import LoraSection
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.hf.checkpoint import gathered
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.decomposed_init import METHODS as DECOMPOSED
from tuneforge.peft.expert_lora import ExpertLoRA
from tuneforge.peft.lora import LOW_PRECISION_MERGE, LoRALinear
from tuneforge.peft.selection import selected_targets
from tuneforge.peft.targets import Candidate, LoraTargetError, matches, pattern_value


@dataclass
class LoraReport:
    """What `apply_lora` did: modules adapted per pattern, modules trained in full, and the
    trainable share."""

    matched: dict[str, list[str]] = field(default_factory=dict)
    saved_modules: list[str] = field(default_factory=list)
    trainable_params: int = 0
    total_params: int = 0

    @property
    def trainable_share(self) -> float:
        return self.trainable_params / max(self.total_params, 1)

    def log(self, logger: logging.Logger) -> None:
        for pattern, names in self.matched.items():
            logger.info("LoRA %s: %d module(s), e.g. %s", pattern, len(names), names[0])
        if self.saved_modules:
            logger.info(
                "trained in full and saved with the adapter: %s", ", ".join(self.saved_modules)
            )
        logger.info(
            "trainable parameters: %d of %d (%.2f%%)",
            self.trainable_params,
            self.total_params,
            100 * self.trainable_share,
        )


_APPLIED: "weakref.WeakKeyDictionary[nn.Module, LoraSection]" = weakref.WeakKeyDictionary()


def applied_lora(model: nn.Module) -> LoraSection:
    """The configuration `apply_lora` put on `model` (the defaults where none was)."""
    return _APPLIED.get(model, LoraSection())


def as_lora_config(config: LoraSection | dict[str, Any]) -> LoraSection:
    return config if isinstance(config, LoraSection) else LoraSection.model_validate(config)


def full_modules(model: Decoder, patterns: list[str]) -> dict[str, str]:
    """{our module name: HF name} of the modules `lora.modules_to_save` selects."""
    family = adapter_for(model.args.family)
    named = {}
    for name, module in model.named_modules():
        if isinstance(module, (LoRALinear, ExpertBank)) or "weight" not in dict(
            module.named_parameters(recurse=False)
        ):
            continue
        hf_name = family.to_hf(f"{name}.weight")
        if hf_name is not None:
            named[name] = hf_name.removesuffix(".weight")
    chosen: dict[str, str] = {}
    for pattern in patterns:
        hits = {n: h for n, h in named.items() if matches(pattern, Candidate(n, h))}
        if not hits:
            raise LoraTargetError(
                f"lora.modules_to_save {pattern!r} matches no module; modules with weights: "
                f"{', '.join(sorted({h.rsplit('.', 1)[-1] for h in named.values()}))}"
            )
        chosen |= hits
    return chosen


def apply_lora(
    model: Decoder,
    config: LoraSection | dict[str, Any],
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
) -> "LoraReport":
    """Adapt what `config` (a LoRA section, or a dict of its fields) selects, freeze everything
    else except `modules_to_save`, and say what was done.
    Adapters live in `dtype` (default: the base weight's), e.g. fp32 adapters on a bf16 base.
    With `enabled: false` nothing is wrapped and every parameter trains."""
    lora = as_lora_config(config)
    if lora_modules(model):
        raise LoraTargetError("the model already carries LoRA adapters")
    total = sum(p.numel() for p in model.parameters())
    if not lora.enabled:
        for param in model.parameters():
            param.requires_grad_(True)
        return LoraReport(trainable_params=total, total_params=total)
    selected = selected_targets(model, lora)
    chosen = {c for hits in selected.values() for c in hits}
    saved = full_modules(model, lora.modules_to_save)
    for param in model.parameters():
        param.requires_grad_(False)
    for candidate in sorted(chosen, key=lambda c: c.hf_name):
        _attach(model, candidate, lora, generator, dtype)
    for name in saved:
        for param in model.get_submodule(name).parameters():
            param.requires_grad_(True)
    _APPLIED[model] = lora  # what the adapter's saved configuration says
    return LoraReport(
        matched={p: sorted(c.hf_name for c in hits) for p, hits in selected.items()},
        saved_modules=sorted(saved.values()),
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=sum(p.numel() for p in model.parameters()),
    )


def _attach(
    model: Decoder,
    candidate: Candidate,
    lora: LoraSection,
    generator: torch.Generator | None,
    dtype: torch.dtype | None,
) -> None:
    rank = pattern_value(lora.rank_pattern, candidate, lora.rank)
    alpha = pattern_value(lora.alpha_pattern, candidate, lora.alpha)
    options: dict[str, Any] = {
        "dropout_position": lora.dropout_position,
        "use_rslora": lora.use_rslora,
        "init": lora.init,
        "compute_dtype": lora.compute_dtype,
    }
    module = model.get_submodule(candidate.module)
    if candidate.projection is None:
        assert isinstance(module, nn.Linear)
        adapter = LoRALinear(
            module, rank, alpha, lora.dropout, dtype, **options, use_dora=lora.use_dora
        )
        adapter.reset_lora_parameters(generator)
        parent_name, _, leaf = candidate.module.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, adapter)
        return
    assert isinstance(module, ExpertBank)
    if lora.init in DECOMPOSED:
        raise LoraTargetError(
            f"lora.init {lora.init}: decomposing expert banks is not supported, and "
            f"{candidate.hf_name} is one: leave the banks out of lora.target_modules, or use "
            "init default"
        )
    if lora.use_dora:
        raise LoraTargetError(
            f"lora.use_dora: DoRA adapts dense linears only, and {candidate.hf_name} is an expert "
            "bank (PEFT has no DoRA for expert parameters either): leave the banks out of "
            "lora.target_modules, or drop use_dora"
        )
    if candidate.projection == "gate_up_proj":
        out_features, in_features = module.gate_up_proj.shape[1], module.gate_up_proj.shape[2]
    else:
        out_features, in_features = module.down_proj.shape[1], module.down_proj.shape[2]
    bank_adapter = ExpertLoRA(
        module.num_experts,
        in_features,
        out_features,
        rank,
        alpha,
        shared=lora.share_expert_adapters,
        dropout=lora.dropout,
        dtype=dtype or module.down_proj.dtype,
        device=module.down_proj.device,
        **options,
    )
    bank_adapter.reset_lora_parameters(generator)
    module.adapters[candidate.projection] = bank_adapter


def lora_modules(model: nn.Module) -> dict[str, LoRALinear | ExpertLoRA]:
    """Every adapter by our module name (`layers.0.mlp.experts.adapters.down_proj` for banks)."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, (LoRALinear, ExpertLoRA))
    }


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The model without its adapters while inside: the base as loaded (a preference
    objective's reference for a fresh adapter, with no second copy of the model)."""
    modules = list(lora_modules(model).values())
    for module in modules:
        module.enabled = False
    try:
        yield
    finally:
        for module in modules:
            module.enabled = True


def _add_in_fp32(weight: torch.Tensor, delta: torch.Tensor) -> None:
    weight.copy_((weight.float() + delta).to(weight.dtype))


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and take the adapters off; returns the model."""
    for name, module in lora_modules(model).items():
        if isinstance(module, LoRALinear):
            merged = module.merged_weight()  # refuses a low-precision base
            cast(nn.Linear, module.base).weight.copy_(merged)
            parent_name, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module.base)
            continue
        bank_name, _, projection = name.rpartition(".adapters.")
        bank = cast(ExpertBank, model.get_submodule(bank_name))
        if projection in bank.low_precision:
            raise TypeError(LOW_PRECISION_MERGE)
        _add_in_fp32(getattr(bank, projection), module.delta_weight())
        del bank.adapters[projection]
    return model


SCORER_MERGE = (
    "a reward model's adapters are folded into its weights when it is saved, which takes dense "
    "LoRA on a base in the model's dtype (not DoRA, expert adapters or a 4-bit or FP8 base)"
)


def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights by their plain names, every adapter folded in (in fp32, then cast to
    its base's dtype), each gathered whole where sharded, one at a time: a rank holds one
    merged weight, not the whole model. Every rank iterates it under FSDP2, in the same order."""
    adapters = lora_modules(model)
    for module in adapters.values():
        dense = isinstance(module, LoRALinear) and isinstance(module.base, nn.Linear)
        if not dense or cast(LoRALinear, module).lora_magnitude is not None:
            raise TypeError(SCORER_MERGE)
    state = model.state_dict()
    bases = {f"{name}.base.weight": (name, cast(LoRALinear, m)) for name, m in adapters.items()}
    factors = {f"{name}.{part}" for name in adapters for part in ("lora_A", "lora_B")}
    biases = {f"{name}.base.bias": f"{name}.bias" for name in adapters}
    for key, tensor in state.items():
        if key in factors:
            continue
        if key not in bases:
            yield biases.get(key, key), tensor
            continue
        name, module = bases[key]
        base = gathered(tensor.detach())
        down = gathered(state[f"{name}.lora_A"].detach()).float()
        up = gathered(state[f"{name}.lora_B"].detach()).float()
        yield f"{name}.weight", (base.float() + (up @ down) * module.scaling).to(base.dtype)
