"""The pace of a run: its steady-state step time and what follows from it (ETA, projections,
when to stop before a time limit)."""

import statistics

WARMUP_STEPS = 3
"""Steps left out of the steady-state step time (compilation, allocator warm-up)."""


class Pace:
    """Step times of this job; the steady state is their mean after the first few. Packed
    batches differ in cost (one holding a long document pays much more attention), so N steps
    take N times the mean; a median would count only the common, cheaper batches."""

    def __init__(self) -> None:
        self.step_times: list[float] = []

    def add(self, seconds: float) -> None:
        self.step_times.append(seconds)

    @property
    def steady_step_s(self) -> float | None:
        settled = self.step_times[WARMUP_STEPS:] or self.step_times
        return statistics.fmean(settled) if settled else None

    def eta_s(self, remaining_steps: int) -> float | None:
        step = self.steady_step_s
        return None if step is None else step * remaining_steps
