"""Which modules a LoRA configuration adapts, and the cost formulas' view of them: one selection
for `apply_lora` and for the planner, which sees the model only as its shape."""

import re

from tuneforge.config.sections.lora import LoraSection
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import LoraShape
from tuneforge.models.decoder import Decoder
from tuneforge.models.hf.adapter import adapter_for
from tuneforge.models.meta import on_meta
from tuneforge.peft.targets import Candidate, LoraTargetError, candidates, matches, pattern_value
from tuneforge.peft.targets import select as select_targets

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def selected_targets(model: Decoder, lora: LoraSection) -> dict[str, list[Candidate]]:
    """{target pattern: the modules it adapts}; refuses patterns that select nothing."""
    found = candidates(model, adapter_for(model.args.family))
    targets = lora.target_modules
    if "target_modules" not in lora.model_fields_set:
        # the default list names dense MLP projections, which an all-MoE model does not have
        targets = [t for t in targets if any(matches(t, c) for c in found)] or targets
    selected = select_targets(found, targets, lora.exclude_modules)
    chosen = {c for hits in selected.values() for c in hits}
    for key, patterns in (
        ("rank_pattern", lora.rank_pattern),
        ("alpha_pattern", lora.alpha_pattern),
    ):
        for pattern in patterns:
            if not any(matches(pattern, c) for c in chosen):
                raise LoraTargetError(f"lora.{key} {pattern!r} matches none of the adapted modules")
    return selected


def lora_shape(lora: LoraSection, args: ModelArgs) -> LoraShape | None:
    """What the cost formulas need of the adapters `lora` puts on a model of shape `args`: the
    projections adapted, their rank (per module where `rank_pattern` says so), expert banks."""
    if not lora.enabled:
        return None
    key = (args, lora.model_dump_json(), "target_modules" in lora.model_fields_set)
    if key not in _SHAPES:  # the planner asks again for every what-if
        _SHAPES[key] = _shape(args, lora)
    return _SHAPES[key]


_SHAPES: dict[tuple[ModelArgs, str, bool], LoraShape] = {}


def _shape(args: ModelArgs, lora: LoraSection) -> LoraShape:
    with on_meta():  # the selection needs the modules' names, not their weights
        model = Decoder(args)
    chosen = {c for hits in selected_targets(model, lora).values() for c in hits}
    ranks = set()
    for candidate in chosen:
        rank = pattern_value(lora.rank_pattern, candidate, lora.rank)
        layer = LAYER.search(candidate.module)
        if rank != lora.rank and layer is not None:
            ranks.add((int(layer.group(1)), candidate.projection or candidate.leaf, rank))
    return LoraShape(
        lora.rank,
        tuple(sorted({c.leaf for c in chosen if c.projection is None})),
        tuple(sorted({c.projection for c in chosen if c.projection is not None})),
        lora.share_expert_adapters,
        lora.compute_dtype == "float32",
        tuple(sorted(ranks)),
        lora.use_dora,
    )
