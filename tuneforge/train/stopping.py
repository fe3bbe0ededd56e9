"""When the loop stops before its last step, and how the ranks agree on it without the host
waiting for the GPU at every step."""

from collections.abc import Callable

import torch
import torch.distributed as dist

from tuneforge.config import RunConfig
from tuneforge.packed import to_device
from tuneforge.runs.pace import Pace
from tuneforge.runs.time_budget import Deadline, StopSignals, time_needed_to_stop
from tuneforge.train.host_values import HostValues, read_host_values, values_to_host
from tuneforge.train.progress import Progress

STOP_REASONS = {0: None, 1: "time limit", 2: "signal", 3: "non-finite"}
"""What the codes mean; the most urgent reason has the highest code."""


class StopCheck:
    """After each queued step: why the loop stops there, if it does, the same on every rank."""

    def __init__(
        self,
        config: RunConfig,
        signals: StopSignals,
        deadline: Deadline,
        pace: Pace,
        device: torch.device,
    ) -> None:
        self.config, self.signals, self.deadline, self.pace = config, signals, deadline, pace
        self.device = device
        self.agreed: HostValues | None = None

    def __call__(
        self, now: bool, progress: Progress, read_pending: Callable[[], bool]
    ) -> str | None:
        """`now`: this step's numbers were read, so agree on it at once; `read_pending` reads a
        step still pending (a stop needs its numbers) and says whether there was one."""
        code = self._local(progress)
        if dist.is_initialized():  # every rank stops at the same step
            code, self.agreed = agree_on_stop(code, self.agreed, now, self.device)
        if code and read_pending() and not dist.is_initialized():
            code = self._local(progress)  # the step just read may add a reason
        return STOP_REASONS[code]

    def _local(self, progress: Progress) -> int:
        return local_stop_code(
            self.config,
            self.signals,
            self.deadline,
            self.pace,
            progress.checkpoint_s,
            progress.nonfinite_in_row,
        )


def local_stop_code(
    config: RunConfig,
    signals: StopSignals,
    deadline: Deadline,
    pace: Pace,
    checkpoint_s: float | None,
    nonfinite_in_row: int,
) -> int:
    """Why this rank would stop after the step just queued. That step may still be running, so
    the time limit keeps one more step in hand."""
    train = config.train
    if nonfinite_in_row and (
        train.on_nonfinite == "stop" or nonfinite_in_row >= train.max_nonfinite_steps
    ):
        return 3
    if signals.received is not None:
        return 2
    if deadline.at is not None:
        step_s = pace.steady_step_s or 0.0
        margin = deadline.margin(config.checkpoint.exit_margin_s)
        needed = step_s + time_needed_to_stop(step_s, checkpoint_s, margin)
        remaining = deadline.remaining()
        if remaining is not None and remaining < needed:
            return 1
    return 0


def agree_on_stop(
    code: int, previous: HostValues | None, now: bool, device: torch.device
) -> tuple[int, HostValues | None]:
    """The most urgent code over the ranks. With `now`, this step's (the host waits for it);
    otherwise the one agreed a step earlier, and this step's reduction still in flight, to pass
    back as `previous` at the next step. Every rank calls this at every step."""
    flag = to_device(torch.tensor([code], dtype=torch.int32), device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    current = values_to_host(flag)
    earlier = int(read_host_values(previous)[0]) if previous is not None else 0
    if now:
        return max(earlier, int(read_host_values(current)[0])), None
    return earlier, current
