"""A run's measured pace against the step time the planner predicts for its configuration: the
one comparison the step-25 projection and `doctor log --config` both state."""

from dataclasses import dataclass

SLOWER = 0.25
"""Measured this much slower than planned: worth a look (the model's own error is within 15%
on the recorded steps, docs/plan.md)."""


@dataclass(frozen=True)
class PaceCheck:
    measured_s: float
    planned_s: float
    rates: str
    bound: str = ""

    @property
    def ratio(self) -> float:
        return self.measured_s / self.planned_s

    @property
    def slow(self) -> bool:
        return self.ratio > 1 + SLOWER

    def describe(self) -> str:
        bound = f", bound by {self.bound}" if self.bound else ""
        return (
            f"{self.measured_s:.3f} s/step measured, {self.planned_s:.3f} planned "
            f"({self.ratio - 1:+.0%}; rates: {self.rates}{bound})"
        )

    def advice(self) -> str:
        return (
            "slower than the step-time model predicts: check the GPU's clock and other "
            "processes (`tuneforge doctor env`), the data loader (tokenising during training), "
            "and allocator retries near the memory limit; if the machine differs from the "
            "calibration, fit its rates: tuneforge plan CONFIG --calibrate RUN_DIR "
            "--save-rates RATES.json"
        )
