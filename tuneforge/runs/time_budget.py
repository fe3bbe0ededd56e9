"""When to stop before the job is killed: a deadline from `train.time_limit` or SLURM's end
time, a margin measured from the loop's own step and checkpoint times, and SIGUSR1/SIGTERM."""

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from tuneforge.config.durations import format_duration, parse_duration

MARGIN_SHARE = 0.05
"""At most this share of a job is kept as its exit margin: a short job would otherwise spend
most of itself on the margin (a 2-minute job, a 60 s margin)."""
MIN_MARGIN_S = 5.0

EXIT_RESUME = 75
"""Stopped on a time limit or a signal after saving: run the same command to resume (EX_TEMPFAIL)."""


@dataclass(frozen=True)
class Deadline:
    at: float | None
    """Epoch seconds, or None without a limit."""
    source: str = ""
    started: float | None = None
    """When the time this deadline counts began (the loop's start)."""

    def remaining(self, now: float | None = None) -> float | None:
        return None if self.at is None else self.at - (now if now is not None else time.time())

    def margin(self, configured_s: float) -> float:
        """`checkpoint.exit_margin_s`, but at most `MARGIN_SHARE` of the time there was."""
        if self.at is None or self.started is None:
            return configured_s
        return min(configured_s, max(MIN_MARGIN_S, MARGIN_SHARE * (self.at - self.started)))


def training_share(deadline: Deadline, now: float | None = None) -> str:
    """How much of the time the job had when training began went to training, for the log."""
    if deadline.at is None or deadline.started is None:
        return ""
    now = now if now is not None else time.time()
    had, used = deadline.at - deadline.started, now - deadline.started
    return (
        f"training ran {format_duration(used)} of the {format_duration(had)} this job had when "
        f"it began ({used / had:.0%}; the rest is kept to save and exit)"
    )


def find_deadline(time_limit: str | None, started: float) -> Deadline:
    """The sooner of `started + time_limit` and the SLURM job's end (`SLURM_JOB_END_TIME`)."""
    candidates = []
    if time_limit is not None:
        candidates.append(
            Deadline(started + parse_duration(time_limit), "train.time_limit", started)
        )
    end = os.environ.get("SLURM_JOB_END_TIME", "")
    if end.isdigit():
        candidates.append(Deadline(float(end), "the SLURM job's end time", started))
    return min(candidates, key=lambda d: d.at or 0.0) if candidates else Deadline(None)


def time_needed_to_stop(step_s: float, checkpoint_s: float | None, margin_s: float) -> float:
    """Seconds to keep in hand: one more step, a checkpoint (1.5x the slowest seen, or two steps
    before one was measured) and the configured margin."""
    saving = 1.5 * checkpoint_s if checkpoint_s is not None else 2 * step_s
    return step_s + saving + margin_s


class StopSignals:
    """SIGUSR1 (SLURM's `--signal`) and SIGTERM ask the loop to save and exit after this step."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        for number in self.SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame) -> None:
        self.received = number

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
