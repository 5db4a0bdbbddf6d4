"""The outbox's result log: results on disk at their own size, spilled, recovered, cut back."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path

import pytest
from support.daemon_harness import result_seqs

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.outbox import Outbox


def _box(tmp_path: Path, **kw) -> Outbox:
    return Outbox(OutboxConfig(path=str(tmp_path / "o.db"), **kw))


def _db_seqs(tmp_path: Path) -> list[int]:
    db = sqlite3.connect(tmp_path / "o.db")
    try:
        return [s for (s,) in db.execute("SELECT seq FROM results ORDER BY seq")]
    finally:
        db.close()


@pytest.mark.parametrize("text, whole", [
    (b"", 0),
    (b"garbage\n", 0),
])
def test_parse_stops_at_the_first_line_that_is_not_a_whole_checked_record(text, whole):
    rec, good = resultlog.parse(text)
    assert good == whole and rec.results == [] and rec.torn_bytes == len(text)


def test_parse_reads_results_acks_and_the_start_record():
    raw = (resultlog._line("S7") + resultlog._line('R8 {"a":1}') + resultlog._line("A8")
           + resultlog._line('R9 {"a":2}'))
    rec, good = resultlog.parse(raw)
    assert good == len(raw) and rec.torn_bytes == 0
    assert rec.last_seq == 9 and rec.acked == 8
    assert rec.results == [(8, '{"a":1}'), (9, '{"a":2}')]
    flipped = raw.replace(b'{"a":2}', b'{"a":3}')  # a changed byte fails its checksum
    rec, good = resultlog.parse(flipped)
    assert rec.results == [(8, '{"a":1}')] and rec.torn_bytes == len(resultlog._line(
        'R9 {"a":3}'))


def test_results_live_in_the_log_until_acked_and_never_reach_the_database(tmp_path):
    box = _box(tmp_path)
    assert box.append_many([{"i": i} for i in range(5)]) == [1, 2, 3, 4, 5]
    assert _db_seqs(tmp_path) == []  # nothing of them in SQLite
    assert [p.seq for p in box.pending(0, 10)] == [1, 2, 3, 4, 5]
    assert box.ack(3) == 3
    assert box.floor() == 4 and box.stats()["results_held"] == 2
    log_size = (tmp_path / "o.db.log").stat().st_size
    assert log_size < 5 * 80  # each result's line is its JSON and a few bytes more
    box.close()
    box = _box(tmp_path)  # a restart takes back exactly the unacked ones
    assert [p.seq for p in box.pending(0, 10)] == [4, 5]
    assert box.append({"i": 5}) == 6
    box.close()


def test_unacked_results_spill_into_the_database_and_the_log_starts_again(tmp_path):
    box = _box(tmp_path, spill_bytes=4096)
    seqs = box.append_many([{"blob": "x" * 100} for _ in range(60)])  # > 4096 bytes
    assert seqs == list(range(1, 61))
    assert _db_seqs(tmp_path) == seqs
    assert resultlog.read(tmp_path / "o.db.log").results == []
    assert resultlog.read(tmp_path / "o.db.log").last_seq == 60
    assert box.append({"after": 1}) == 61  # in the log, above the database's
    assert [p.seq for p in box.pending(58, 10)] == [59, 60, 61]
    assert box.ack(60) == 60 and box.floor() == 61
    box.close()
    box = _box(tmp_path)
    assert [p.seq for p in box.pending(0, 100)] == [61]
    box.close()


def test_an_emptied_log_starts_again_and_no_seq_is_reused(tmp_path):
    box = _box(tmp_path, log_restart_bytes=4096)
    for i in range(40):
        box.append({"blob": "y" * 150, "i": i})
        box.ack(i + 1)
    assert (tmp_path / "o.db.log").stat().st_size < 4096 + 200
    box.close()
    box = _box(tmp_path)
    assert box.last_seq() == 40 and box.append({"i": 40}) == 41
    box.close()


def test_a_torn_last_line_is_cut_off_and_the_rest_is_kept(tmp_path, caplog):
    box = _box(tmp_path)
    box.append_many([{"i": 1}, {"i": 2}])
    box.close()
    with open(tmp_path / "o.db.log", "ab") as f:  # a write cut by a power loss
        f.write(b'0badc0de R3 {"i":')
    box = _box(tmp_path)
    assert "cut off 17 bytes" in caplog.text
    assert [p.seq for p in box.pending(0, 10)] == [1, 2]
    assert box.append({"i": 3}) == 3  # appended after the cut, not after the garbage
    box.close()
    assert result_seqs(tmp_path / "o.db") == [1, 2, 3]


def test_parse_skips_a_damaged_line_and_keeps_the_whole_lines_after_it():
    lines = [resultlog._line(r) for r in ("S7", 'R8 {"a":1}', 'R9 {"a":2}', "A8",
                                          'R10 {"a":3}')]
    damaged = lines[2].replace(b'"a":2', b'"a":6')  # one flipped bit mid-file
    rec, good = resultlog.parse(b"".join([*lines[:2], damaged, *lines[3:]]))
    assert rec.results == [(8, '{"a":1}'), (10, '{"a":3}')] and rec.acked == 8
    assert rec.torn_bytes == 0 and good == sum(map(len, lines))
    assert rec.skipped_bytes == len(damaged) and rec.skipped_lines == 1
    # R9's seq was given before: never again, though only the ack follows it
    rec, _ = resultlog.parse(b"".join([*lines[:2], damaged, lines[3]]))
    assert rec.results == [(8, '{"a":1}')] and rec.last_seq >= 9


def test_a_flipped_newline_costs_one_result_not_the_whole_line_after_it():
    """A bit flipped in a newline joins two lines: the second is whole, its checksum good,
    but it was skipped with the first, and since recovery rewrites the log without damaged
    lines its bytes are gone for good. Reading resumes at a record start inside the line."""
    lines = [resultlog._line(r) for r in ("S0", *(f'R{i} {{"i":{i}}}' for i in range(1, 6)))]
    data = bytearray(b"".join(lines))
    data[sum(map(len, lines[:3])) - 1] ^= 0x01  # the newline ending R2
    rec, good = resultlog.parse(bytes(data))
    assert [q for q, _ in rec.results] == [1, 3, 4, 5] and rec.last_seq == 5
    assert rec.skipped_bytes == len(lines[2]) and rec.skipped_lines == 1
    assert good == len(data) and rec.torn_bytes == 0


def test_one_damaged_line_costs_that_result_and_no_other(tmp_path, caplog):
    box = _box(tmp_path)
    box.append_many([{"i": i} for i in range(5)])
    box.close()
    path = tmp_path / "o.db.log"
    data = bytearray(path.read_bytes())
    data[data.index(b"\n") + 20] ^= 0x01  # a flipped bit in the second line (seq 2)
    path.write_bytes(bytes(data))
    box = _box(tmp_path)
    assert "1 damaged lines (" in caplog.text and "skipped" in caplog.text
    assert [p.seq for p in box.pending(0, 10)] == [1, 3, 4, 5]
    assert box.stats()["log_damaged_bytes"] > 0
    # the loss is a durable event too (the log is rewritten: the ERROR is not said again)
    ev = box.take_startup_event()
    assert ev["type"] == "outbox_log_damaged" and ev["lines"] == 1 and ev["results_kept"] == 4
    assert box.take_startup_event() is None
    # rewritten without the damaged line, every whole record kept (nothing after it cut):
    # the loss is said once, not at every start until the log next restarts
    again = resultlog.read(path)
    assert not again.skipped_bytes and [q for q, _ in again.results] == [1, 3, 4, 5]
    assert box.append({"i": 5}) == 6  # no seq given twice
    box.close()
    caplog.clear()
    box = _box(tmp_path)
    assert [p.seq for p in box.pending(0, 10)] == [1, 3, 4, 5, 6]
    assert "damaged" not in caplog.text and box.stats()["log_damaged_bytes"] == 0
    box.close()


def test_a_write_cut_short_by_a_full_disk_leaves_no_fragment_and_loses_nothing(
        tmp_path, monkeypatch):
    box = _box(tmp_path)
    assert box.append_many([{"i": i} for i in range(5)]) == [1, 2, 3, 4, 5]
    path = tmp_path / "o.db.log"
    whole = path.stat().st_size
    real = os.write
    taken: list[int] = []

    def full_disk(fd: int, data: bytes) -> int:  # takes part of a line, then refuses
        if not taken:
            taken.append(7)
            return real(fd, bytes(data)[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(resultlog.os, "write", full_disk)
    assert box.ack(2) == 2  # its record is refused midway
    assert path.stat().st_size == whole  # cut back to the last whole line
    assert box.stats()["disk_full"]  # the outbox's full-disk state, as for SQLite
    assert box.append({"i": 5}) == 6  # waits in memory
    assert box.ack(5) == 3  # every result of the log acked while the disk is full
    monkeypatch.undo()  # space returns
    box._held.next_try = 0.0  # the retry is due now (no wait on the wall clock)
    assert box.append({"i": 6}) == 7 and not box.stats()["disk_full"]
    box.close()
    box = _box(tmp_path)  # the acks held in memory were applied: only 6 and 7 wait
    assert [p.seq for p in box.pending(0, 10)] == [6, 7]
    assert box.append({"i": 7}) == 8
    box.close()


def test_acks_the_full_disk_refused_are_applied_when_space_returns(tmp_path, monkeypatch):
    box = _box(tmp_path)
    box.append_many([{"i": i} for i in range(5)])

    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(resultlog.os, "write", full_disk)
    assert box.ack(2) == 2 and box.stats()["disk_full"]
    assert box.ack(5) == 3  # not written while the disk refuses: held in memory
    monkeypatch.undo()
    box._held.next_try = 0.0  # the retry is due now (no wait on the wall clock)
    box.put("event", {"e": 1})  # the next write flushes what waits
    assert not box.stats()["disk_full"]
    box.close()
    box = _box(tmp_path)
    assert box.pending(0, 10) == [] and box.append({"i": 5}) == 6
    box.close()


def test_a_failed_append_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    log = resultlog.ResultLog(tmp_path / "r.log", sync=True)
    log.recover()
    log.append([(1, '{"a":1}')])
    monkeypatch.setattr(resultlog.os, "fdatasync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError):
        log.append([(2, '{"a":2}')])  # written, but not made durable: not stored
    monkeypatch.undo()
    log.append([(3, '{"a":3}')])
    log.close()
    rec, _ = resultlog.parse((tmp_path / "r.log").read_bytes())
    assert rec.results == [(1, '{"a":1}'), (3, '{"a":3}')] and rec.torn_bytes == 0


def test_health_waits_in_memory_and_reaches_the_database_only_when_unsent(tmp_path):
    box = _box(tmp_path, spill_after_s=0.05)
    first = box.put("health", {"n": 1})
    assert [r[0] for r in box.others(10)] == [first]
    box.remove([first])  # published: never written
    assert box.others(10) == []
    second = box.put("health", {"n": 2})
    time.sleep(0.06)  # past spill_after_s: the next put finds it unsent
    third = box.put("health", {"n": 3})
    db = sqlite3.connect(tmp_path / "o.db")
    ids = [i for (i,) in db.execute("SELECT id FROM other WHERE kind='health' ORDER BY id")]
    db.close()
    assert ids == [second, third] and first < second < third
    assert [r[0] for r in box.others(10)] == [second, third]
    box.remove([second, third])
    assert box.others(10) == []
    box.close()


class _Clock:
    """The outbox's monotonic clock, moved by the test (no sleeps, no races under load)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_steady_flow_with_acks_never_spills_however_long_it_runs(tmp_path):
    # the queue is never empty (one result in flight), but none waits spill_after_s unacked
    clock = _Clock()
    box = Outbox(OutboxConfig(path=str(tmp_path / "o.db"), spill_after_s=0.2), clock=clock)
    box.append({"i": 0})
    for i in range(1, 5):
        clock.t += 0.15  # each waits less than spill_after_s; all together wait far more
        box.append({"i": i})
        box.ack(i)  # the previous one
    # never moved into the database: the log was not started again, it holds them all
    assert [q for q, _ in resultlog.read(tmp_path / "o.db.log").results] == [1, 2, 3, 4, 5]
    assert _db_seqs(tmp_path) == []
    clock.t += 0.2  # now the last one has waited spill_after_s: the next append spills it
    box.append({"i": 5})
    assert _db_seqs(tmp_path) == [5, 6]
    box.close()


def test_spill_after_zero_publishes_results_written_straight_to_the_database(tmp_path):
    box = _box(tmp_path, spill_after_s=0)
    assert box.append_many([{"i": i} for i in range(3)]) == [1, 2, 3]
    assert _db_seqs(tmp_path) == [1, 2, 3]
    assert [p.seq for p in box.pending(0, 50)] == [1, 2, 3] and box.floor() == 1
    assert box.ack(3) == 3 and box.pending(0, 50) == []
    box.append({"i": 3})  # after an ack emptied the table
    assert [p.seq for p in box.pending(3, 50)] == [4] and box.floor() == 4
    box.close()


def test_pending_pages_through_many_unacked_results_in_the_log(tmp_path):
    # the publisher asks for the next batch after the last one sent, before any ack
    box = _box(tmp_path)
    box.append_many([{"i": i} for i in range(300)])
    assert _db_seqs(tmp_path) == []  # all in the log
    for after in (0, 50, 100, 250):
        assert [p.seq for p in box.pending(after, 50)] == list(range(after + 1, after + 51))
    assert [p.seq for p in box.pending(280, 50)] == list(range(281, 301))
    assert box.pending(300, 50) == []
    box.close()


@pytest.mark.parametrize("cut", [True, False], ids=["cut", "crash-before-the-cut"])
def test_a_log_started_again_in_place_keeps_the_highest_seq(tmp_path, cut):
    """restart_in_place (a full disk: no room for the copy beside the log) writes `S<last>`
    over the log's head, then cuts the rest. A crash between leaves that record, a damaged
    line and the old records: the highest seq given is kept either way, nothing is pending
    that was acked, and with the cut the log is the one record."""
    path = tmp_path / "o.db.log"
    lines = [resultlog._line(f'R{i} {{"i":{i},"pad":"{"x" * 40}"}}') for i in range(1, 31)]
    path.write_bytes(b"".join(lines) + resultlog._line("A30"))
    log = resultlog.ResultLog(path, sync=False)
    if cut:
        log.restart_in_place(30)
        assert path.read_bytes() == resultlog._line("S30") and log.size == path.stat().st_size
    else:  # the head written, the cut never made
        rec = resultlog._line("S30")
        path.write_bytes(rec + path.read_bytes()[len(rec):])
    log.close()
    got = resultlog.read(path)
    assert got.last_seq == 30 and all(s <= got.acked for s, _ in got.results)
    assert got.skipped_lines == (0 if cut else 1)
