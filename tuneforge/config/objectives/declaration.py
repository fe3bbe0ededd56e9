"""What an objective asks of a run, in terms of its configuration: the data it reads, the
frozen models it holds beside the trained one, and what it refuses. The config's rules, the
planner, the data pipeline and the trainer read these; the objective's computation lives in
`train/objectives/`."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tuneforge.config.sections.model import ModelSection

CROSS_ENTROPY = "cross-entropy, nats per supervised token"

DataFormat = Literal["conversations", "pairs", "unpaired"]
"""`pairs`: each record a preference pair, packed as two documents side by side (`data/pairs.py`);
`unpaired`: each record a reply labelled desirable or not, packed beside its mismatched sample
(`data/unpaired.py`)."""


@dataclass(frozen=True)
class FrozenModel:
    """A model held frozen beside the trained one (a preference run's reference, a teacher, a
    GRPO reward model)."""

    role: str
    """`reference`, `teacher` or `reward model`, as the run's log names it."""
    kind: str
    """How it is held: `adapters_off`, `frozen_copy`, `precomputed` (a reference), `online`
    (a teacher, a reward model), `cached` (a teacher)."""
    model: ModelSection | None = None
    """Its own weights (a teacher's section, a reward model's); None: the trained model's."""
    field: str = ""
    """The configuration field of `model` (`distill.teacher`)."""
    forward_every_step: bool = True
    """A forward of every token each step; False: one pass over the data before training."""
    holds_weights: bool = False
    """Its own weights on the device beside the trained model's (a frozen copy, a teacher)."""
    note: str = ""
    """What else it costs, for `tuneforge plan` (e.g. a cache's bytes per token)."""


def starting_model_kind(lora: Any) -> str:
    """How a run holds its model as training started (a reference): the base with its adapters
    disabled for LoRA on a fresh adapter (no second copy), else a frozen copy (full fine-tuning,
    or an adapter continued from `lora.init_adapter`)."""
    return "adapters_off" if lora.enabled and lora.init_adapter is None else "frozen_copy"


def no_frozen_models(*_: Any) -> tuple[FrozenModel, ...]:
    return ()


@dataclass(frozen=True)
class ObjectiveDeclaration:
    name: str
    """`train.objective`'s value."""
    summary: str
    """One line for `train.objective`'s help."""
    data_format: DataFormat = "conversations"
    settings: str | None = None
    """The key of its own configuration section, if it has one."""
    reads: tuple[str, ...] = ()
    """The sections `frozen` is called with, in order."""
    frozen: Callable[..., tuple[FrozenModel, ...]] = no_frozen_models
    title: Callable[[Any], str] | None = None
    """Its short name from its settings (`dpo sigmoid`), as `plan` and `compare` show it."""
    loss_label: Callable[[Any], str] = lambda _: CROSS_ENTROPY
    """What its `loss` measures, with the unit, from its settings."""
    cross_entropy_metric: str | None = "loss"
    """The training metric holding the cross-entropy per supervised token, if it logs one
    (held out: `eval_` before it)."""
    refuses_captured_step: str | None = None
    """Why its step cannot be captured as one CUDA graph (train.cuda_graph); None: it can."""
    samples_per_record: Callable[[Any], int] = lambda _: 1
    """Documents a step trains on for each record read, from its settings (GRPO: the group)."""
    keeps_record_fields: bool = False
    """Its documents carry their records' other fields (a reward function's reference values)."""
    generated_tokens: Callable[[Any], int] = lambda _: 0
    """Tokens it samples after each prompt before training on them (their key/value cache is
    the step's other peak), from its settings."""
    writes_replies: bool = True
    """Its model writes replies (held-out exact match is measured); False: it scores them."""

    @property
    def per_token_loss(self) -> bool:
        """Its loss is the cross-entropy per supervised token (it has a perplexity)."""
        return self.cross_entropy_metric == "loss"

    def frozen_models(self, config: Any) -> tuple[FrozenModel, ...]:
        """What `config` (a RunConfig) holds frozen for this objective."""
        return self.frozen(*(getattr(config, name) for name in self.reads))

    def settings_of(self, config: Any) -> Any:
        """Its own section of `config` (None without one)."""
        return getattr(config, self.settings) if self.settings else None

    def sampling(self, config: Any) -> tuple[int, int]:
        """(documents trained per record read, tokens sampled after each prompt) of `config`
        (a RunConfig): (1, 0) for an objective that samples nothing."""
        settings = self.settings_of(config)
        return self.samples_per_record(settings), self.generated_tokens(settings)

    def short_name(self, settings: Any) -> str:
        return self.name if self.title is None else self.title(settings)
