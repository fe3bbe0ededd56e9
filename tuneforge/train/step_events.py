"""What happens at a step besides the step itself: evaluation, a periodic checkpoint, the
projection of the whole run's time, the end. (The learning rate's schedule is `optim.py`'s.)"""

from dataclasses import dataclass

from tuneforge.config import RunConfig


@dataclass(frozen=True)
class StepEvents:
    evaluate: bool
    save: bool
    """A periodic checkpoint (`checkpoint.save_steps`); the last step saves the final weights."""
    project: bool
    last: bool
    read_now: bool
    """The loop acts on this step's numbers: read them before anything else is queued."""


class EventSchedule:
    def __init__(self, config: RunConfig, total_steps: int, evaluates: bool) -> None:
        self.config, self.total_steps, self.evaluates = config, total_steps, evaluates

    def at(self, step: int) -> StepEvents:
        train, save_steps = self.config.train, self.config.checkpoint.save_steps
        every = self.config.eval.every_steps
        last = step == self.total_steps
        save = save_steps is not None and step % save_steps == 0
        evaluate = bool(self.evaluates and every and step % every == 0)
        project = step == self.config.logging.projection_step
        read_now = save or evaluate or project or last or train.on_nonfinite == "stop"
        return StepEvents(evaluate and not last, save, project, last, read_now)
