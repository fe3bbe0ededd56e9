"""`checkpoint:` saving during and after the run."""

from pydantic import Field

from tuneforge.config.sections.base import Section


class CheckpointSection(Section):
    save_steps: int | None = Field(None, ge=1)
    """Save a checkpoint every N steps (null: only at the end). Keep it below one job's step budget.
    """
    keep_last: int = Field(2, ge=1)
    """How many step checkpoints to keep."""
    save_final: bool = True
    """Save the trained weights (or the adapter) when the run ends."""
    exit_margin_s: float = Field(60.0, ge=0)
    """Least time kept before a time limit to save and exit; the loop adds its measured step and
    checkpoint times."""
