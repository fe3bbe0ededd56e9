"""The events a step brings besides itself: evaluation, periodic checkpoints, the projection of
the run's time, the end, and which of them make the loop read the step's numbers at once."""

from tuneforge.config import load_config
from tuneforge.train.step_events import EventSchedule


def test_the_schedule_says_what_happens_at_each_step():
    config = load_config(
        "examples/demo.yaml",
        ["checkpoint.save_steps=4", "eval.every_steps=3", "logging.projection_step=5"],
    )
    events = EventSchedule(config, total_steps=9, evaluates=True)
    plans = {step: events.at(step) for step in range(1, 10)}
    assert [s for s, p in plans.items() if p.save] == [4, 8]
    assert [s for s, p in plans.items() if p.evaluate] == [3, 6]  # the last step evaluates anyway
    assert [s for s, p in plans.items() if p.project] == [5]
    assert [s for s, p in plans.items() if p.last] == [9]
    assert [s for s, p in plans.items() if p.read_now] == [3, 4, 5, 6, 8, 9]
    assert not EventSchedule(config, 9, evaluates=False).at(3).evaluate
