"""Threads for runs on the CPU: one per core on an idle machine, the idle cores on a busy one
(threads that wait for each other made the demo seven times slower), what the user sets always."""

import os

import pytest

from tuneforge.hardware.cpu import choose_cpu_threads


@pytest.fixture
def machine(monkeypatch):
    def set_machine(cores: int, load: float, omp: str | None = None):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)

    return set_machine


def test_threads_follow_the_idle_cores(machine):
    machine(2, 0.1)
    assert choose_cpu_threads().threads == 2
    machine(2, 2.6)  # the loaded 2-core machine of the report
    chosen = choose_cpu_threads()
    assert chosen.threads == 1 and "OMP_NUM_THREADS" in chosen.describe()
    machine(16, 3.0)
    assert choose_cpu_threads().threads == 13
    assert choose_cpu_threads(processes=2).threads == 6


def test_the_users_choice_wins(machine):
    machine(2, 5.0, omp="2")
    assert choose_cpu_threads().threads == 2
    machine(8, 0.0, omp="junk")
    assert choose_cpu_threads().threads == 8
