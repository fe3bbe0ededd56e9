import random

import pytest

from tuneforge.data.bin_packing import STRATEGIES, best_fit_decreasing, first_fit_decreasing


def naive_first_fit_decreasing(lengths, budget):
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins, room = [], []
    for index in order:
        for slot, free in enumerate(room):
            if lengths[index] <= free:
                bins[slot].append(index)
                room[slot] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(budget - lengths[index])
    return bins


def naive_best_fit_decreasing(lengths, budget):
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins, room = [], []
    for index in order:
        fitting = [slot for slot, free in enumerate(room) if lengths[index] <= free]
        if fitting:
            slot = min(fitting, key=lambda s: room[s])
            bins[slot].append(index)
            room[slot] -= lengths[index]
        else:
            bins.append([index])
            room.append(budget - lengths[index])
    return bins


def lognormal_lengths(count, budget, seed=0):
    rng = random.Random(seed)
    return [min(budget, max(1, int(rng.lognormvariate(5.0, 0.9)))) for _ in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_fast_first_fit_equals_the_naive_one(seed):
    lengths = lognormal_lengths(800, 512, seed)
    assert first_fit_decreasing(lengths, 512) == naive_first_fit_decreasing(lengths, 512)


@pytest.mark.parametrize("seed", range(5))
def test_fast_best_fit_fills_bins_like_the_naive_one(seed):
    lengths = lognormal_lengths(800, 512, seed)
    fast = best_fit_decreasing(lengths, 512)
    naive = naive_best_fit_decreasing(lengths, 512)
    # ties between equally full bins may go either way; the fill levels may not differ
    assert sorted(sum(lengths[i] for i in b) for b in fast) == sorted(
        sum(lengths[i] for i in b) for b in naive
    )


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_document_once_within_budget_and_efficient(strategy):
    lengths = lognormal_lengths(20000, 4096)
    bins = STRATEGIES[strategy](lengths, 4096)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 4096 for b in bins)
    assert sum(lengths) / (len(bins) * 4096) >= 0.95
    assert bins == STRATEGIES[strategy](lengths, 4096)


def test_a_document_longer_than_the_budget_is_refused():
    with pytest.raises(ValueError, match="more than the budget"):
        first_fit_decreasing([10, 600], 512)
