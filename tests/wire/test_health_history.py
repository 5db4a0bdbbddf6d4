"""The device's health history file (runtime/wire/health_history.py) as a hostile state
directory sees it."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from runtime.wire.health_history import NAME, PAGE, HealthHistory, read


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


def _h(i: int, temp: float = 50.0) -> dict:
    return {"t": 1_700_000_000.0 + i, "temp_c": temp, "pipeline": {"rate_hz": 10.0}}


@pytest.mark.parametrize("pages", [1, 3])
def test_records_are_held_and_written_whole_pages_at_a_time(tmp_path, pages):
    """With flush_s set, records wait in memory until they reach the end of the file's page
    and `pages - 1` more: those that fit are written with padding to the last page's
    boundary, the rest wait; once the oldest is flush_s old all are written, padded too;
    close writes the rest unpadded. Every write but the last ends on a 4 KiB boundary (each
    page dirtied once), and every record reads back once, in order."""
    clock = _Clock()
    hist = HealthHistory(tmp_path, flush_s=600.0, clock=clock, pages=pages)
    path = tmp_path / NAME
    sizes, n = [], 0
    while not path.exists():  # under the pages held: nothing written
        clock.t = n * 1.0
        hist.append(_h(n))
        n += 1
    assert path.stat().st_size == pages * PAGE and n > 3 * pages
    assert len(read(tmp_path)) < n  # the record that did not fit waits for the next page
    while len(sizes) < 3:  # page after page, each written whole
        clock.t = n * 1.0
        hist.append(_h(n))
        n += 1
        size = path.stat().st_size
        if not sizes or size != sizes[-1]:
            sizes.append(size)
    assert all(s % PAGE == 0 for s in sizes), sizes
    assert all(b - a == pages * PAGE for a, b in itertools.pairwise(sizes)), sizes
    clock.t += 600.0  # the oldest held is flush_s old: everything, to the boundary
    hist.append(_h(n))
    n += 1
    assert path.stat().st_size % PAGE == 0
    assert [r["t"] for r in read(tmp_path)] == [_h(i)["t"] for i in range(n)]
    hist.append(_h(n, 41.0))
    n += 1
    hist.close()
    recs = read(tmp_path)
    assert [r["t"] for r in recs] == [_h(i)["t"] for i in range(n)] and recs[-1]["temp_c"] == 41.0
    assert hist.errors == 0


def test_a_page_write_after_a_torn_line_keeps_both_apart_and_aligned(tmp_path):
    """A power cut left half a line: the next write starts on a new line, still ends on the
    page's boundary, and the torn line is skipped, not joined to a record."""
    (tmp_path / NAME).write_text('{"t":1700000000.0,"temp_c":5')
    clock = _Clock()
    hist = HealthHistory(tmp_path, flush_s=60.0, clock=clock, pages=1)
    n = 0
    while (tmp_path / NAME).stat().st_size < PAGE:
        hist.append(_h(n))
        n += 1
    assert (tmp_path / NAME).stat().st_size == PAGE
    hist.close()
    assert [r["t"] for r in read(tmp_path)] == [_h(i)["t"] for i in range(n)]


def test_every_record_at_once_without_flush_s(tmp_path):
    """flush_s = 0: each record is written when made, unpadded (as before the pages)."""
    hist = HealthHistory(tmp_path)
    hist.append(_h(0))
    size = (tmp_path / NAME).stat().st_size
    assert 0 < size < 1024 and len(read(tmp_path)) == 1


def test_a_flush_across_the_rotation_loses_nothing_and_stays_bounded(tmp_path):
    """Held records that do not fit go one by one across the rotation: both files within
    max_bytes, every record of the current and rotated file in order."""
    clock = _Clock()
    hist = HealthHistory(tmp_path, max_bytes=2048, flush_s=60.0, clock=clock)
    t0 = 1_700_000_000.0
    for i in range(100):  # past 2048 bytes of records
        hist.append({"t": t0 + i, "temp_c": 50.0})
    hist.close()
    assert all(p.stat().st_size <= 2048 for p in tmp_path.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME, NAME + ".1"]
    ts = [r["t"] for r in read(tmp_path)]
    assert ts == sorted(ts) and ts[-1] == t0 + 99
    assert ts == [t0 + i for i in range(100 - len(ts), 100)]  # no gap before the newest
    assert hist.errors == 0


def test_a_writer_that_appends_whole_lines_does_not_read_the_file_back(tmp_path, monkeypatch):
    """Whether the file ends mid-line is read once, then known from this writer's own
    writes: reading its last byte at every append updated its atime, which dirtied its
    inode's page again between writes. A file changed by another writer is read again."""
    import runtime.wire.health_history as hh

    reads = []
    real = hh._ends_mid_line
    monkeypatch.setattr(hh, "_ends_mid_line", lambda p: reads.append(p) or real(p))
    clock = _Clock()
    hist = HealthHistory(tmp_path, flush_s=600.0, clock=clock, pages=1)
    for i in range(300):  # several pages
        clock.t = float(i)
        hist.append(_h(i))
    assert (tmp_path / NAME).stat().st_size >= 2 * PAGE and reads == []
    with (tmp_path / NAME).open("a") as f:
        f.write('{"t":1')  # another writer, cut short
    hist.flush()
    assert len(reads) == 1
    assert [r["t"] for r in read(tmp_path)] == [_h(i)["t"] for i in range(300)]


def test_records_are_stored_compact_and_read_back_whole(tmp_path):
    """The file leaves out figures that are None and keeps 4 significant digits (the time
    to the millisecond): `read` gives back every figure `record` made, None where it was
    None, each within what a plot draws, from a line a quarter shorter."""
    from runtime.wire.health_history import record

    h = {"t": 1_796_561_298.2419844, "temp_c": None, "throttled": False, "rung": 4.0,
         "pipeline": {"rate_hz": 0.8624509327678577, "latency_ms": {"p95": 9.218345801491521}},
         "slo": {"target_ms": 100.0}, "rung_energy_mj": 1.51712, "power_w": 8.0,
         "accuracy": 0.99, "passive_trip_c": 86.5,
         "storage": {"write_bytes_per_day": 123_456_789.4,
                     "card_write_bytes_per_day": 987_654_321.4}}
    full = record(h, {"hot": 90.0})
    hist = HealthHistory(tmp_path)
    hist.append(h, {"hot": 90.0})
    line = (tmp_path / NAME).read_text()
    assert len(line) < 0.8 * len(json.dumps(full, separators=(",", ":"))), line
    (back,) = read(tmp_path)
    assert back.keys() == full.keys()
    for k, v in full.items():
        if v is None or isinstance(v, bool | dict):
            assert back[k] == v, k
        else:
            assert back[k] == pytest.approx(v, rel=5e-4, abs=1e-3), k
    assert back["t"] == pytest.approx(full["t"], abs=0.0005)
    assert back["write_bytes_per_day"] == 123_456_789.0
    assert back["card_write_bytes_per_day"] == 987_654_321.0


@pytest.mark.parametrize("rec, stored", [
    # a simulated clock runs days ahead in seconds: to the millisecond, as `t`, not 4 digits
    ({"sim_t": 1_234_567.8912}, {"sim_t": 1_234_567.891}),
    ({"t": 1_796_561_298.2419844}, {"t": 1_796_561_298.242}),
    # the trip points are a dict: compacted as the record is
    ({"trips": {"hot": 90.123456, "crit": None}}, {"trips": {"hot": 90.12}}),
    ({"rung": 4.0, "power_w": 8.0}, {"rung": 4, "power_w": 8}),  # "4", not "4.0"
])
def test_compact_keeps_what_a_plot_needs(rec, stored):
    from runtime.wire.health_history import compact

    got = compact(rec)
    assert got == stored and json.dumps(got) == json.dumps(stored)
