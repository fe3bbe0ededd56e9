"""The typed tree of one run's configuration: one section per key, each in its own module
(`sections/`, and `objectives/` for the objectives' settings). YAML only fills it."""

from pydantic import model_validator

from tuneforge.config.objectives.distill import DistillSection
from tuneforge.config.objectives.dpo import DpoSection
from tuneforge.config.objectives.grpo import GrpoSection
from tuneforge.config.objectives.kto import KtoSection
from tuneforge.config.objectives.orpo import OrpoSection
from tuneforge.config.objectives.reward import RewardSection
from tuneforge.config.sections.base import Section
from tuneforge.config.sections.checkpoint import CheckpointSection
from tuneforge.config.sections.data import DataSection
from tuneforge.config.sections.eval import EvalSection
from tuneforge.config.sections.logging import LoggingSection
from tuneforge.config.sections.lora import LoraSection
from tuneforge.config.sections.model import ModelSection, TokenizerSection
from tuneforge.config.sections.parallel import ParallelSection
from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.config.sections.run import RunSection
from tuneforge.config.sections.train import TrainSection


class RunConfig(Section):
    """The whole configuration of one run."""

    run: RunSection = RunSection()
    """Name and run directory."""
    model: ModelSection
    """Which model to fine-tune."""
    tokenizer: TokenizerSection = TokenizerSection()
    """Which tokenizer and chat template."""
    data: DataSection
    """Training and held-out data."""
    lora: LoraSection = LoraSection()
    """Low-rank adapters, or full fine-tuning."""
    train: TrainSection
    """Optimisation."""
    precision: PrecisionSection = PrecisionSection()
    """Low-precision matmuls."""
    dpo: DpoSection = DpoSection()
    """Preference training (train.objective: dpo)."""
    distill: DistillSection = DistillSection()
    """Knowledge distillation (train.objective: distill)."""
    orpo: OrpoSection = OrpoSection()
    """Odds-ratio preference optimisation (train.objective: orpo)."""
    grpo: GrpoSection = GrpoSection()
    """Reinforcement learning from reward functions (train.objective: grpo)."""
    kto: KtoSection = KtoSection()
    """Preference training on replies labelled desirable or not (train.objective: kto)."""
    reward: RewardSection = RewardSection()
    """A reward model on preference pairs (train.objective: reward)."""
    checkpoint: CheckpointSection = CheckpointSection()
    """Saving."""
    logging: LoggingSection = LoggingSection()
    """Metrics and progress."""
    eval: EvalSection = EvalSection()
    """Held-out evaluation: how often, and generation-based accuracy."""
    parallel: ParallelSection = ParallelSection()
    """Devices and sharding."""

    @model_validator(mode="after")
    def _evaluation_steps_by_their_older_name(self) -> "RunConfig":
        if self.eval.every_steps is None and self.train.eval_steps is not None:
            self.eval.every_steps = self.train.eval_steps
        return self
