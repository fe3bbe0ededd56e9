"""Where the run stands, as the loop counts it and a checkpoint keeps it."""

from dataclasses import dataclass


@dataclass
class Progress:
    step: int = 0
    tokens_seen: int = 0
    nonfinite_steps: int = 0
    """Steps skipped in the whole run for a non-finite loss or gradient norm."""
    nonfinite_in_row: int = 0
    """Such steps in a row, up to the last one read (this job only)."""
    elapsed_before: float = 0.0
    """Seconds the run took in earlier jobs."""
    checkpoint_s: float | None = None
    """The slowest checkpoint write of this job."""
