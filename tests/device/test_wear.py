"""Bytes written a day and a card's life at that rate (runtime/device/wear.py)."""

from __future__ import annotations

import os

import pytest

from runtime.config import ConfigError, from_dict
from runtime.device import wear

DAY = 86400.0


@pytest.mark.parametrize("per_day, tbw, days", [
    (None, 10.0, None),  # no rate yet
    (0.0, 10.0, None),  # nothing written: no end in sight, not a number
    (1e9, 0.0, None),  # rating unknown
    (1e9, 10.0, 10_000.0),  # 1 GB a day on a 10 TBW card
    (15e9, 10.0, 10e12 / 15e9),  # the outbox before the log: ~15 GB a day at 10 results/s
    (2.4e6 * 86.4, 30.0, 30e12 / (2.4e6 * 86.4)),
])
def test_life_days(per_day, tbw, days):
    got = wear.life_days(per_day, tbw)
    assert got == (None if days is None else pytest.approx(days))


@pytest.mark.parametrize("samples, per_day", [
    ([], None),
    ([(0.0, 0)], None),
    ([(0.0, 0), (30.0, 1000)], None),  # under MIN_SPAN_S: the start's writes
    ([(0.0, 0), (60.0, 6000)], 6000 / 60 * DAY),
    ([(0.0, 5000), (100.0, 1000)], None),  # a counter that went back: not a rate
])
def test_rate_over_the_window(samples, per_day):
    r = wear.WriteRate()
    for t, n in samples:
        r.add(t, n)
    assert r.per_day() == (None if per_day is None else pytest.approx(per_day))


def test_the_window_slides_and_keeps_its_oldest_sample_inside():
    r = wear.WriteRate(window_s=100.0)
    for i in range(0, 301, 10):  # 10 bytes a second, then 0 after t=200
        r.add(float(i), min(i, 200) * 10)
    assert r.span_s() == pytest.approx(100.0)
    assert r.per_day() == 0.0  # the last 100 s wrote nothing
    rep = wear.report(r, 0.0)
    assert rep == {"write_bytes_per_day": 0, "window_s": 100.0, "rated_tbw": None,
                   "life_days": None}


def test_report_with_a_rating():
    r = wear.WriteRate()
    r.add(0.0, 0)
    r.add(600.0, 600 * 1000)  # 1 kB/s
    rep = wear.report(r, 1.0)
    assert rep["write_bytes_per_day"] == 86_400_000
    assert rep["life_days"] == pytest.approx(1e12 / 86.4e6, abs=0.1)


def test_this_process_write_bytes_is_read_and_grows(tmp_path):
    before = wear.read_write_bytes()
    if before is None:
        pytest.skip("this kernel does not report /proc/self/io write_bytes")
    with open(tmp_path / "f", "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert wear.read_write_bytes() >= before + (1 << 20)


def test_missing_proc_io_is_none(tmp_path):
    assert wear.read_write_bytes(tmp_path / "io") is None


@pytest.mark.parametrize("value, ok", [(0.0, True), (600.0, True), (-1.0, False)])
def test_storage_section(value, ok):
    if ok:
        assert from_dict({"storage": {"rated_tbw": value}}).storage.rated_tbw == value
    else:
        with pytest.raises(ConfigError, match="rated_tbw"):
            from_dict({"storage": {"rated_tbw": value}})
