"""Which modules a LoRA configuration adapts, by Hugging Face module names.

A pattern is one of: a name or dotted suffix (`q_proj`, `self_attn.q_proj`; a plain leaf name
never selects expert banks), a glob over full names (`model.layers.1*.mlp.*`; `.` is a dot), a
regex over full names (`re:model\\.layers\\.[0-3]\\..*`), `all-linear` (every linear except the
output layer and MoE routers), or a Megatron name, read as its HF equivalents. Expert banks are
selected as `experts.gate_up_proj` (gate and up stacked, as transformers holds them; also
`experts.gate_proj` / `experts.up_proj`, and Mixtral's `w1` / `w3`) and `experts.down_proj`
(Mixtral's `w2`).
"""

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from torch import nn

from tuneforge.errors import TuneforgeError
from tuneforge.models.hf.adapter import StateDictAdapter
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.lora import LoRALinear

ALL_LINEAR = "all-linear"
BANK_PROJECTIONS = ("gate_up_proj", "down_proj")
ALIASES = {
    "linear_qkv": ["q_proj", "k_proj", "v_proj"],
    "linear_proj": ["o_proj"],
    # Megatron's latent attention (DeepSeek-V2)
    "linear_q_proj": ["q_proj"],
    "linear_q_down_proj": ["q_a_proj"],
    "linear_q_up_proj": ["q_b_proj"],
    "linear_kv_down_proj": ["kv_a_proj_with_mqa"],
    "linear_kv_up_proj": ["kv_b_proj"],
    "linear_fc1": ["gate_proj", "up_proj", "experts.gate_up_proj"],
    "linear_fc2": ["down_proj", "experts.down_proj"],
    "experts.linear_fc1": ["experts.gate_up_proj"],
    "experts.linear_fc2": ["experts.down_proj"],
    "experts.gate_proj": ["experts.gate_up_proj"],
    "experts.up_proj": ["experts.gate_up_proj"],
    # Mixtral's checkpoint names its experts' gate, down and up projections w1, w2 and w3
    **{name: ["experts.gate_up_proj"] for name in ("w1", "w3", "experts.w1", "experts.w3")},
    **{name: ["experts.down_proj"] for name in ("w2", "experts.w2")},
}


class LoraTargetError(TuneforgeError):
    """A LoRA pattern that matches nothing, or selects something LoRA cannot adapt."""


@dataclass(frozen=True)
class Candidate:
    """Something LoRA can adapt: a linear, or one projection of an expert bank."""

    module: str
    """Our module name (the bank's for a projection)."""
    hf_name: str
    projection: str | None = None
    """`gate_up_proj` or `down_proj` for an expert bank; None for a linear."""

    @property
    def leaf(self) -> str:
        return self.hf_name.rsplit(".", 1)[-1]


def candidates(model: nn.Module, family: StateDictAdapter) -> list[Candidate]:
    found = []
    wrapped = set()
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):  # already adapted: the wrapper stands for its base
            found.append(Candidate(name, family.module_to_hf(name)))
            wrapped.add(f"{name}.base")
        elif isinstance(module, nn.Linear) and name not in wrapped:
            found.append(Candidate(name, family.module_to_hf(name)))
        elif isinstance(module, ExpertBank):
            bank = family.bank_to_hf(name)
            found += [Candidate(name, f"{bank}.{p}", p) for p in BANK_PROJECTIONS]
    return found


def _is_router(candidate: Candidate) -> bool:
    return candidate.module.endswith(".router")


def _matches_one(pattern: str, candidate: Candidate) -> bool:
    name = candidate.hf_name
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    if any(char in pattern for char in "*?["):
        return fnmatchcase(name, pattern)
    if candidate.projection is not None and "." not in pattern:
        return False
    return name == pattern or name.endswith("." + pattern)


def matches(pattern: str, candidate: Candidate) -> bool:
    """Whether `pattern` (after Megatron and expert aliases) selects `candidate`."""
    if pattern == ALL_LINEAR:
        return candidate.projection is None
    return any(_matches_one(p, candidate) for p in ALIASES.get(pattern, [pattern]))


def describe(found: list[Candidate]) -> str:
    leaves = sorted({c.leaf for c in found if c.projection is None})
    banks = sorted({f"experts.{c.projection}" for c in found if c.projection is not None})
    example = next((c.hf_name for c in found if c.projection is None), "")
    return (
        f"linear layers: {', '.join(leaves)}"
        + (f"; expert banks: {', '.join(banks)}" if banks else "")
        + (f"; full names look like {example}" if example else "")
    )


def select(
    found: list[Candidate], targets: list[str], exclude: list[str]
) -> dict[str, list[Candidate]]:
    """The candidates each target pattern selects, after exclusions; every pattern must match."""
    unmatched = [p for p in exclude if not any(matches(p, c) for c in found)]
    selected: dict[str, list[Candidate]] = {}
    for pattern in targets:
        chosen = [
            c
            for c in found
            if matches(pattern, c)
            and not (pattern == ALL_LINEAR and (c.leaf == "lm_head" or _is_router(c)))
        ]
        if not chosen:
            unmatched.append(pattern)
        selected[pattern] = [c for c in chosen if not any(matches(p, c) for p in exclude)]
    if unmatched:
        raise LoraTargetError(
            f"lora patterns {unmatched} match nothing in this model; it has {describe(found)}"
        )
    for chosen in selected.values():
        for candidate in chosen:
            if candidate.leaf == "lm_head":
                raise LoraTargetError(
                    "LoRA on lm_head is not supported (the loss reads its weight directly): "
                    "list lm_head in lora.modules_to_save to train it in full"
                )
    return selected


def pattern_value(patterns: dict, candidate: Candidate, default):
    """The value of the first pattern in `patterns` that selects `candidate`, else `default`."""
    for pattern, value in patterns.items():
        if matches(pattern, candidate):
            return value
    return default
