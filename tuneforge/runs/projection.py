"""At a set step, from the measured pace: how long the whole run takes, whether it finishes in
this job, how many jobs it needs, and whether periodic checkpoints will happen at all."""

import logging
import math
from collections.abc import Callable

from tuneforge.config import RunConfig
from tuneforge.config.durations import format_duration, parse_duration
from tuneforge.runs.pace import Pace
from tuneforge.runs.time_budget import Deadline

MANY_JOBS = 20


def project(
    step: int,
    total_steps: int,
    elapsed: float,
    pace: Pace,
    deadline: Deadline,
    job_started: float,
    config: RunConfig,
    now: float | None = None,
    planned: Callable[[float], tuple[bool, str, str]] | None = None,
) -> list[tuple[int, str]]:
    """(log level, message) lines. `planned`: given the measured step time, whether it is
    slower than the planner predicts, the comparison and the advice (`plan.pace_check`)."""
    step_s = pace.steady_step_s
    if step_s is None:
        return []
    remaining_steps = total_steps - step
    lines = [
        (
            logging.INFO,
            f"projected: {format_duration(elapsed + remaining_steps * step_s)} for {total_steps} steps "
            f"({step_s:.2f} s/step), {format_duration(remaining_steps * step_s)} to go",
        )
    ]
    if planned is not None:
        slow, comparison, advice = planned(step_s)
        level = logging.WARNING if slow else logging.INFO
        lines.append((level, f"step time: {comparison}" + (f": {advice}" if slow else "")))
    margin = deadline.margin(config.checkpoint.exit_margin_s)
    left = deadline.remaining(now)
    save_steps = config.checkpoint.save_steps
    if left is not None and deadline.at is not None:
        steps_here = max(0, int((left - margin) / step_s))
        if steps_here >= remaining_steps:
            lines.append((logging.INFO, f"finishes within this job ({format_duration(left)} left)"))
        else:
            job_s = (
                parse_duration(config.train.time_limit)
                if config.train.time_limit is not None
                else deadline.at - job_started
            )
            per_job = max(1, int((job_s - margin) / step_s))
            jobs = 1 + math.ceil((remaining_steps - steps_here) / per_job)
            message = (
                f"this job reaches about step {step + steps_here} before {deadline.source}; "
                f"the run needs {jobs} jobs in all: chain them with `tuneforge train ... --resume auto`"
            )
            if jobs > MANY_JOBS:
                message += (
                    f" — {jobs} jobs is a lot: consider cancelling and reconfiguring "
                    "(fewer steps, a larger micro-batch, less checkpointing, more GPUs)"
                )
            lines.append((logging.WARNING, message))
        to_next_save = save_steps - step % save_steps if save_steps is not None else 0
        if (
            save_steps is not None
            and step + to_next_save < total_steps
            and to_next_save * step_s > left - margin
        ):
            lines.append(
                (
                    logging.WARNING,
                    f"the next periodic checkpoint (step {step + to_next_save}, "
                    f"checkpoint.save_steps={save_steps}) is {format_duration(to_next_save * step_s)} "
                    f"of training away but this job has {format_duration(left)} left: no periodic "
                    "checkpoint will be written in it (the save before the time limit still will)",
                )
            )
    elif save_steps is not None:
        lines.append(
            (
                logging.WARNING if save_steps * step_s > 3600 else logging.INFO,
                f"no time limit known (train.time_limit, SLURM): checkpoint.save_steps={save_steps} "
                f"means {format_duration(save_steps * step_s)} between checkpoints",
            )
        )
    return lines
