"""The trainer's word on the GPU's clock: each step's clock and power in the metrics, and a
warning once when heat or a hardware slowdown holds the clock down step after step; checked on
sequences of readings (the device's own need an NVIDIA GPU: tests/gpu)."""

import logging

import torch

from tuneforge.hardware.nvml import Sample
from tuneforge.train.device_watch import ClockWatch, DeviceWatch

POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x80


class Readings:
    """NVML's part of `Nvml`, reading the given samples in turn."""

    max_sm_clock_mhz, power_limit_w = 1980.0, 700.0

    def __init__(self, samples: list[Sample]):
        self.samples = iter(samples)

    def read(self) -> Sample:
        return next(self.samples)


def test_the_reasons_bits_are_named():
    assert Sample(1, 1, POWER_CAP | SW_THERMAL).held_down_by() == ["power cap", "thermal"]
    assert Sample(1, 1, HW_POWER_BRAKE).held_down_by() == ["hardware slowdown"]
    assert Sample(1, 1, HW_SLOWDOWN | 0x1).held_down_by() == ["hardware slowdown"]  # 0x1: idle
    assert Sample(1, 1, 0).held_down_by() == []


def test_heat_held_at_patience_steps_in_a_row_is_said_once():
    hot, cool = Sample(1100, 450, SW_THERMAL), Sample(1700, 690, POWER_CAP)
    sequence = [hot] * 4 + [cool] + [hot] * 7  # four in a row, a break, then seven
    watch = ClockWatch(Readings(sequence), rank=3, patience=5, interval_s=0)
    checks = {step: watch.check(step) for step in range(1, len(sequence) + 1)}
    warned = [step for step, (_, note) in checks.items() if note]
    assert warned == [10]  # the fifth hot step after the break, and only then
    note = checks[10][1]
    assert "rank 3's GPU" in note and "thermal at 5 readings in a row" in note
    assert "SM clock 1,100 of 1,980 MHz, 450 W" in note
    assert checks[5][0] == {
        "gpu_sm_clock_mhz": 1700.0,
        "gpu_power_w": 690.0,
        "gpu_clock_held_down_by": ["power cap"],
    }


def test_the_power_cap_alone_is_logged_and_never_warned_of():
    watch = ClockWatch(Readings([Sample(1600, 695, POWER_CAP)] * 20), patience=5, interval_s=0)
    checks = [watch.check(step) for step in range(1, 21)]
    assert all(note is None for _, note in checks)
    assert all(stats["gpu_clock_held_down_by"] == ["power cap"] for stats, _ in checks)


def test_readings_are_taken_at_most_once_per_interval():
    """Steps between readings carry no clock fields; the readings' own count sets the
    patience."""
    now = [0.0]
    hot = Sample(1100, 450, SW_THERMAL)
    watch = ClockWatch(Readings([hot] * 3), patience=3, interval_s=1.0, clock=lambda: now[0])
    checks = []
    for step in range(1, 11):  # ten steps of 0.25 s: readings at steps 1, 5 and 9
        checks.append(watch.check(step))
        now[0] += 0.25
    read_at = [step for step, (stats, _) in enumerate(checks, 1) if stats]
    assert read_at == [1, 5, 9]
    assert [step for step, (_, note) in enumerate(checks, 1) if note] == [9]


def test_without_nvml_there_is_nothing_to_read():
    assert ClockWatch(None).check(7) == ({}, None)


def test_a_failed_reading_stops_the_readings_and_is_said_once_without_stopping_the_run():
    class Failing(Readings):
        def read(self):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    watch = ClockWatch(Failing([]))
    stats, note = watch.check(12)
    assert stats == {} and "step 12: the GPU's clock and power are no longer read" in note
    assert "NVML_ERROR_GPU_IS_LOST" in note
    assert watch.check(13) == ({}, None)


def test_the_device_watch_merges_the_clock_into_the_metrics_and_logs_its_warning(caplog):
    watch = DeviceWatch(torch.device("cpu"), rank=0, settle_steps=3)
    assert watch.clocks.nvml is None and watch.check(1) == {}
    watch.clocks = ClockWatch(
        Readings([Sample(900, 300, HW_SLOWDOWN)] * 2), patience=2, interval_s=0
    )
    with caplog.at_level(logging.WARNING):
        first, second = watch.check(1), watch.check(2)
    assert first["gpu_sm_clock_mhz"] == 900.0 and second["gpu_power_w"] == 300.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "hardware slowdown at 2 readings in a row" in warnings[0]
