"""`logging:` metrics lines, progress and experiment trackers."""

from typing import Literal

from pydantic import Field

from tuneforge.config.sections.base import Section


class LoggingSection(Section):
    log_steps: int = Field(1, ge=1)
    """Write a metrics line every N steps."""
    progress: bool = True
    """Show a progress bar on the terminal."""
    tensorboard: bool = True
    """Write TensorBoard event files to <run dir>/tensorboard."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = []
    """Experiment trackers given the run's config and every metrics line: wandb (WANDB_MODE=offline
    writes to the run directory) and mlflow (MLFLOW_TRACKING_URI, or <run dir>/mlruns), each with
    its extra installed; tensorboard here is the same as tensorboard: true."""
    project: str = "tuneforge"
    """The W&B project and the MLflow experiment the run is logged to."""
    peak_tflops: float | None = Field(None, gt=0)
    """Peak dense bf16 TFLOP/s of one device for MFU (default: from the GPU's name)."""
    projection_step: int = Field(25, ge=2)
    """Step at which the projected total time (and jobs needed under a time limit) is printed."""
