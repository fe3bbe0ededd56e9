"""An objective as a component: its declaration (what it asks of the run, `config/objectives/`)
and the builder of its module. The loop, the bench and the evaluation ask it; none of them
names an objective."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.schema import RunConfig
from tuneforge.models.decoder import Decoder
from tuneforge.parallel_dims import ParallelDims
from tuneforge.train.frozen.passes import FrozenPassData
from tuneforge.train.objectives.seam import Objective


@dataclass
class ObjectiveSetup:
    """What an objective's module is built from, once the trained model has its adapters and
    precision and before it is wrapped (a frozen copy is taken of it as it then is)."""

    config: RunConfig
    model: Decoder
    device: torch.device
    passes: FrozenPassData | None = None
    """The data a frozen pass runs over before training (a precomputed reference, a cached
    teacher); None where there is none (the benchmark)."""
    dims: ParallelDims = field(default_factory=ParallelDims)
    """The trained model's layout: where it is sharded (FSDP2) a frozen model beside it is too."""
    resumed: dict[str, Any] | None = None
    """The objective's `resume_state()` from the checkpoint the run resumes; None when fresh."""
    tokenizer: Any = None
    """The run's tokenizer (an objective that reads what its model writes decodes with it)."""


@dataclass(frozen=True)
class ObjectiveComponent:
    declaration: ObjectiveDeclaration
    build: Callable[[ObjectiveSetup], Objective]
