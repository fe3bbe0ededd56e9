"""One preflight check: what it looks at, and the problems it finds as configuration issues,
each naming its field and what to do. A check needs at most the configuration, the model's
config.json, the tokenizer, the data files and the environment (`Inputs`), never the weights."""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tuneforge.config.errors import ConfigIssue
from tuneforge.config.schema import RunConfig
from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:  # torch is imported only by the checks that need it
    from tuneforge.data.training_data import TrainingData
    from tuneforge.parallel.distributed import Dist


@dataclass
class Inputs:
    """What the checks read, each read once, when a check first asks for it."""

    config: RunConfig
    world: "Dist | None" = None
    """The processes `torchrun` started (`train`); None where no process group is joined
    (`config validate`, `plan`): the world size is then unknown."""
    world_size: int | None = None
    """The processes a plan is made for (`--gpus` × `--nodes`) where no process group is joined."""
    data: "TrainingData | None" = None
    """The training data, once a check has read it (`train` goes on with it)."""
    tokenizer_problem: str | None = None

    @cached_property
    def model_args(self) -> Any:
        """The model's shape: its config.json, or the catalog's shape."""
        from tuneforge.plan.frozen_models import section_model_args

        return section_model_args(self.config.model)

    @cached_property
    def tokenizer(self) -> Any:
        """The run's tokenizer; None where it does not load (`tokenizer_problem` says why)."""
        from tuneforge.train.build import load_tokenizer

        try:
            return load_tokenizer(self.config)
        except TuneforgeError as error:
            self.tokenizer_problem = str(error)
            return None


@dataclass(frozen=True)
class Check:
    name: str
    reads: str
    """What it needs beyond the configuration (said by `tuneforge config validate --checks`)."""
    run: Callable[[Inputs], list[ConfigIssue]] = field(repr=False)
    machine: bool = False
    """About this machine rather than the configuration (packages, trackers, GPU features)."""
