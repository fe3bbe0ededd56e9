"""Fitting a GPU's step rates (`StepRates`) to measured steps: the rates that make the step-time
model's predictions nearest the measurements, relative error for relative error. A
Levenberg-Marquardt fit in log space (rates stay positive), pulled gently towards the starting
rates so that a rate the measurements do not exercise keeps its value."""

import math
from dataclasses import dataclass

import numpy as np

from tuneforge.hardware.step_rates import FITTED, StepRates
from tuneforge.plan.step_time import step_time
from tuneforge.plan.step_work import StepWork

PRIOR_WEIGHT = 0.05
"""How strongly each rate is held to its starting value, against one measurement's log error."""
SPAN = 4.0
"""A rate moves at most e^4 (55x) from its start."""
BOUNDED = {"power_limit": 1.0, "light_power": 1.0}
"""Rates that are shares: at most this."""


@dataclass(frozen=True)
class Sample:
    """A measured step: the work of each step of its cycle on each rank, and its mean seconds."""

    name: str
    works: list[list[StepWork]]
    seconds: float
    link_gbps: float = 450.0


def sample_seconds(sample: Sample, rates: StepRates) -> float:
    """The model's mean step over the sample's cycle: each step waits for its slowest rank."""
    steps = [
        max(step_time(work, rates, sample.link_gbps).total_s for work in ranks)
        for ranks in sample.works
    ]
    return sum(steps) / len(steps)


def log_errors(samples: list[Sample], rates: StepRates) -> np.ndarray:
    return np.array([math.log(max(sample_seconds(s, rates), 1e-12) / s.seconds) for s in samples])


def _rates_at(start: StepRates, theta: np.ndarray, name: str) -> StepRates:
    """`start` with its positive fitted rates at exp(`theta`) (a zero rate stays zero)."""
    values = start.fitted_values()
    free = iter(np.exp(theta))
    for index, key in enumerate(FITTED):
        if values[index] > 0:
            values[index] = float(next(free))
            values[index] = min(values[index], BOUNDED.get(key, values[index]))
    return start.with_fitted(values, name)


def fit_rates(
    samples: list[Sample],
    start: StepRates,
    name: str,
    iterations: int = 60,
    prior_weight: float = PRIOR_WEIGHT,
) -> StepRates:
    """The rates nearest `samples`, from `start`."""
    if not samples:
        raise ValueError("no measured steps to fit")
    theta0 = np.log(np.array([v for v in start.fitted_values() if v > 0]))
    theta, damping = theta0.copy(), 1e-2

    def residuals(t: np.ndarray) -> np.ndarray:
        t = np.clip(t, theta0 - SPAN, theta0 + SPAN)
        prior = math.sqrt(prior_weight) * (t - theta0)
        return np.concatenate([log_errors(samples, _rates_at(start, t, name)), prior])

    current = residuals(theta)
    for _ in range(iterations):
        jacobian = np.empty((current.size, theta.size))
        for index in range(theta.size):
            step = np.zeros_like(theta)
            step[index] = 1e-4
            jacobian[:, index] = (residuals(theta + step) - current) / 1e-4
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ current
        while True:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-9), -gradient)
            trial = residuals(theta + delta)
            if trial @ trial < current @ current:
                theta, current, damping = theta + delta, trial, max(damping / 3, 1e-7)
                break
            damping *= 4
            if damping > 1e8:
                return _rates_at(start, np.clip(theta, theta0 - SPAN, theta0 + SPAN), name)
        if float(np.abs(delta).max()) < 1e-5:
            break
    return _rates_at(start, np.clip(theta, theta0 - SPAN, theta0 + SPAN), name)
