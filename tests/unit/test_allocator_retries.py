"""The trainer's word when the CUDA caching allocator starts retrying (a run at its memory
limit), checked on the counter's sequence: the device's own counter needs a GPU."""

from tuneforge.train.device_watch import RetryWatch, memory_stats


def test_retries_after_the_first_steps_are_reported_once():
    watch = RetryWatch(settle_steps=3)
    counts = {1: 0, 2: 4, 3: 5, 4: 5, 5: 7, 6: 9}  # compilation's retries in steps 1-3
    notes = {step: watch.check(step, {"alloc_retries": n}) for step, n in counts.items()}
    assert [step for step, note in notes.items() if note] == [5]
    assert "found no room 2 time(s) since step 3" in notes[5]
    assert "tuneforge plan" in notes[5]


def test_a_resumed_run_settles_from_its_own_first_steps():
    """The count starts again in a new process; the steps go on from the checkpoint's."""
    watch = RetryWatch(settle_steps=100 + 3)
    assert watch.check(101, {"alloc_retries": 3}) is None
    assert watch.check(104, {"alloc_retries": 3}) is None
    assert watch.check(105, {"alloc_retries": 4}) is not None


def test_nothing_to_watch_without_a_gpu():
    import torch

    stats = memory_stats(torch.device("cpu"))
    assert stats == {}
    assert RetryWatch(settle_steps=0).check(5, stats) is None
