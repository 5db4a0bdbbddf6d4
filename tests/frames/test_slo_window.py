"""The pipeline's and each source's rate in health (runtime/frames/slo_window.py)."""

from __future__ import annotations

import time

import pytest

from runtime.frames.multisource import Lane
from runtime.frames.slo_window import SloWindow, window_rate


@pytest.mark.parametrize("n, now, first, want", [
    (301, 1000.0, 970.0, 10.0),  # steady state: 30 s of 10 Hz, as before
    (151, 1000.0, 985.0, 10.0),  # a source that began 15 s ago: over its 15 s, as before
    (151, 1000.0, 970.0, 5.0),  # gone silent 15 s ago: a falling rate, as before
    (2001, 100.0, 98.0, 1000.0),  # a full store at 1 kHz: over the 2 s it holds, as before
    (2, 100.002, 100.001, 1.0),  # two results 1 ms apart, then a health (was 1,000/s)
    (8, 100.005, 100.0, 7.0),  # a batch stored with one stamp, a health 5 ms later (1,400)
    (6, 100.0, 100.0, 5.0),  # ... at the same instant (was 0: no span)
    (11, 101.0, 100.0, 10.0),  # from 1 s on, as before
    (1, 100.5, 100.0, 0.0),  # one result: no rate yet
    (0, 100.5, 100.0, 0.0),
])
def test_window_rate(n, now, first, want):
    assert window_rate(n, now, first) == pytest.approx(want)


def test_the_first_health_after_a_start_reads_no_burst():
    """Two results 1 ms apart just after the start, then a health: at most one a second
    (was 1/(now - the first result): ~500/s), for the pipeline and its source."""
    w = SloWindow()
    t = time.monotonic()
    w.add(t - 0.002, 1.0, 1.0)
    w.add(t - 0.001, 1.0, 1.0)
    assert 0 < w.stats()["rate_hz"] <= 1.0
    lane = Lane("cam", open=lambda: None)
    lane.e2e.extend([(t - 0.002, 5.0), (t - 0.001, 5.0)])
    assert 0 < lane.stats(0)["rate_hz"] <= 1.0
