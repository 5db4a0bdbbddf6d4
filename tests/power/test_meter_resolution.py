"""Meters declare their resolution (power/meter_resolution.py) and bad counters are
distrusted (power/meter_trust.py): pure, on tables and a simulated clock."""

from __future__ import annotations

import math

import pytest

from power import meter_trust
from power.meter_resolution import Resolution, hwmon_interval, measure_period, period_from_changes


@pytest.mark.parametrize("times, period", [
    ([], None), ([1.0], None),
    ([0.1, 0.2, 0.3, 0.4], 0.1),
    ([0.1, 0.21, 0.3, 0.41, 0.5], 0.1),  # a late poll: one long gap and one short, median
    ([1.0, 1.0], None),
])
def test_period_from_changes(times, period):
    got = period_from_changes(times)
    assert got == (pytest.approx(period) if period is not None else None)


def test_measure_period_on_a_simulated_counter():
    t = [0.0]
    counter = lambda: math.floor(t[0] / 0.1) * 7.0  # noqa: E731 (ticks every 100 ms)
    res = measure_period(counter, clock=lambda: t[0],
                         sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert res.basis == "measured" and res.period_s == pytest.approx(0.1, abs=0.003)
    still = measure_period(lambda: 5.0, clock=lambda: t[0],
                           sleep=lambda s: t.__setitem__(0, t[0] + s), max_s=1.0)
    assert still.period_s is None and "changed 0 times" in still.note
    assert still.min_window_s() == math.inf and still.error(10.0) == math.inf


@pytest.mark.parametrize("res, window, error", [
    (Resolution(0.1), 2.0, 0.05),          # NVML-like counter
    (Resolution(0.1, 1.0), 22.0, 0.05),    # power averaged over 1 s
    (Resolution(0.001), 0.02, 0.05),       # RAPL
    (Resolution(0.0, 0.0, "model"), 0.0, 0.0),
])
def test_window_for_five_percent(res, window, error):
    assert res.min_window_s() == pytest.approx(window)
    if window:
        assert res.error(window) == pytest.approx(error)


def test_hwmon_update_interval(tmp_path):
    assert hwmon_interval(tmp_path) is None
    (tmp_path / "update_interval").write_text("140\n")
    r = hwmon_interval(tmp_path)
    assert r is not None and r.period_s == pytest.approx(0.14) and r.basis == "documented"
    (tmp_path / "update_interval").write_text("garbage")
    assert hwmon_interval(tmp_path) is None


@pytest.mark.parametrize("readings, period, why", [
    ([(0.0, 0.0), (0.1, 6.0), (0.2, 12.0)], 0.1, None),
    ([(0.0, 0.0)], 0.1, "fewer than two"),
    ([(0.0, 10.0), (0.1, 5.0)], 0.1, "went back by 5.000 J"),
    ([(0.0, 0.0), (0.1, 500.0)], 0.1, "more than 2000 W"),
    ([(0.0, 0.0), (0.1, 6.0), (2.5, 6.0)], 0.1, "did not move for 2.4 s"),
    ([(0.0, 0.0), (0.1, 6.0), (1.5, 6.0)], 0.1, None),  # under 20 periods
    ([(0.0, 0.0), (0.1, float("nan"))], 0.1, "read nan"),
    ([(0.0, 0.0), (30.0, 0.0)], None, "did not move for 30.0 s"),
    ([(0.0, 0.0), (0.0, 6.0)], 0.1, "rose 6.0 J between two readings"),  # in no time
])
def test_a_counter_is_distrusted(readings, period, why):
    got = meter_trust.problem(readings, period)
    assert (got is None) if why is None else (got is not None and why in got)
