"""The device's health history file (runtime/wire/health_history.py) as a hostile state
directory sees it."""

from __future__ import annotations

import time

from runtime.wire.health_history import NAME, HealthHistory, read


def test_a_symlink_planted_as_the_history_is_not_followed(tmp_path):
    """The history was opened with a plain append: a symlink planted in its place made the
    daemon append its health lines to whatever file the link named (as root: any file on
    the box). Refused like every other state file (runtime/durable.py refuses planted
    links): the target is untouched, the append counted as an error, and once the link is
    gone the history is written again."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / NAME).symlink_to(victim)
    hist = HealthHistory(state)
    hist.append({"t": time.time(), "temp_c": 50.0})
    assert victim.read_text() == "keep me\n"
    assert hist.errors == 1
    (state / NAME).unlink()
    hist.append({"t": time.time(), "temp_c": 51.0})
    assert [r["temp_c"] for r in read(state)] == [51.0]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_records_are_held_until_a_page_or_flush_s_then_written_together(tmp_path):
    """With flush_s set, records wait in memory: the file is written when a page's worth is
    held or the oldest is flush_s old, and at close; nothing is lost or reordered."""
    clock = _Clock()
    hist = HealthHistory(tmp_path, flush_s=60.0, clock=clock)
    t0 = 1_700_000_000.0
    for i in range(3):
        clock.t = i * 5.0
        hist.append({"t": t0 + i, "temp_c": 50.0 + i})
    assert not (tmp_path / NAME).exists()  # 3 small records, 10 s: held
    clock.t = 60.0
    hist.append({"t": t0 + 3, "temp_c": 53.0})  # the oldest is 60 s old: all written
    assert [r["temp_c"] for r in read(tmp_path)] == [50.0, 51.0, 52.0, 53.0]
    n = 4
    while (tmp_path / NAME).stat().st_size < 4096 + 200:  # a page's worth: written at once
        hist.append({"t": t0 + n, "temp_c": 40.0})
        n += 1
    assert len(read(tmp_path)) == n
    hist.append({"t": t0 + n, "temp_c": 41.0})
    assert len(read(tmp_path)) == n  # held again
    hist.close()
    assert [r["t"] for r in read(tmp_path)] == [t0 + i for i in range(n + 1)]
    assert hist.errors == 0


def test_a_flush_across_the_rotation_loses_nothing_and_stays_bounded(tmp_path):
    """Held records that do not fit go one by one across the rotation: both files within
    max_bytes, every record of the current and rotated file in order."""
    clock = _Clock()
    hist = HealthHistory(tmp_path, max_bytes=2048, flush_s=60.0, clock=clock)
    t0 = 1_700_000_000.0
    for i in range(12):
        hist.append({"t": t0 + i, "temp_c": 50.0})
    hist.close()
    assert all(p.stat().st_size <= 2048 for p in tmp_path.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME, NAME + ".1"]
    ts = [r["t"] for r in read(tmp_path)]
    assert ts == sorted(ts) and ts[-1] == t0 + 11
    assert ts == [t0 + i for i in range(12 - len(ts), 12)]  # no gap before the newest
    assert hist.errors == 0
