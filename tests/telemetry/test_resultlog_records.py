"""What the result log's parser takes as a whole record, what the seqs of damaged lines count
for, and that a new line never follows a torn or uncut fragment
(runtime/telemetry/resultlog.py): one case a test."""

from __future__ import annotations

import pytest

from runtime.telemetry import resultlog
from runtime.telemetry.resultlog import _line


def test_a_line_whose_separator_flipped_is_not_whole():
    """The checksum covers the record, not the space before it: a flipped separator must
    still fail the line (it is not `<crc> <record>`)."""
    bad = bytearray(_line('R1 {"a":1}'))
    bad[8] = ord("x")
    rec, _ = resultlog.parse(bytes(bad) + _line('R2 {"a":2}'))
    assert rec.results == [(2, '{"a":2}')] and rec.skipped_lines == 1


def test_the_highest_ack_holds_whatever_the_order():
    rec, _ = resultlog.parse(_line("S0") + _line("A5") + _line("A3"))
    assert (rec.acked, rec.last_seq) == (5, 5)


def test_results_come_back_in_seq_order_whatever_the_file_s_order():
    rec, _ = resultlog.parse(_line("S0") + _line('R2 {"b":2}') + _line('R1 {"a":1}'))
    assert [q for q, _ in rec.results] == [1, 2]


def test_each_record_start_in_a_skipped_line_counts_as_a_seq_given():
    """R2's newline flipped and R3 damaged too: one skipped line holding two records, with
    only an ack after it. Both seqs may have been published: the next is 4, not 3."""
    lines = [_line(r) for r in ("S0", 'R1 {"i":1}', 'R2 {"i":2}', 'R3 {"i":3}', "A1")]
    r2 = bytearray(lines[2])
    r2[-1] ^= 0x01  # the newline ending R2
    r3 = lines[3].replace(b'"i":3', b'"i":7')  # R3's checksum fails
    rec, _ = resultlog.parse(b"".join([lines[0], lines[1], bytes(r2), r3, lines[4]]))
    assert [q for q, _ in rec.results] == [1] and rec.skipped_lines == 1
    assert rec.last_seq == 3


def test_a_record_start_inside_a_result_s_text_does_not_hide_the_real_one():
    """A result whose JSON holds text shaped like a record start (`deadbeef R9`), its newline
    flipped: the whole record after it is still found inside the joined line."""
    lines = [_line(r) for r in ("S0", 'R1 {"s":"deadbeef R9 x"}', 'R2 {"i":2}', 'R3 {"i":3}')]
    r1 = bytearray(lines[1])
    r1[-1] ^= 0x01
    rec, _ = resultlog.parse(b"".join([lines[0], bytes(r1), lines[2], lines[3]]))
    assert [q for q, _ in rec.results] == [2, 3] and rec.last_seq == 3


def _log_after(tmp_path, torn: bytes) -> resultlog.ResultLog:
    """A log holding R1 whole and `torn` after it, recovered."""
    path = tmp_path / "r.log"
    path.write_bytes(_line("S0") + _line('R1 {"a":1}') + torn)
    log = resultlog.ResultLog(path, sync=False)
    log.recover()
    return log


def test_a_torn_tail_is_cut_before_the_next_line_is_written(tmp_path):
    """The next append starts a line of its own: it never follows the torn fragment (which
    would cost it at the next start, read as a damaged line)."""
    log = _log_after(tmp_path, _line('R2 {"a":2}')[:7])
    log.append([(2, '{"b":2}')])
    log.close()
    rec, _ = resultlog.parse((tmp_path / "r.log").read_bytes())
    assert [q for q, _ in rec.results] == [1, 2]
    assert (rec.skipped_bytes, rec.torn_bytes) == (0, 0)


def test_a_fragment_that_could_not_be_cut_is_cut_before_the_next_write(tmp_path, monkeypatch):
    """A full disk takes part of a line and refuses the rest, and cutting the fragment back
    fails too: the next write cuts it first."""
    import errno
    import os

    log = _log_after(tmp_path, b"")
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, bytes(data)[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    def refused(fd, size):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(resultlog.os, "write", full_disk)
        m.setattr(resultlog.os, "ftruncate", refused)
        with pytest.raises(OSError):
            log.append([(2, '{"a":2}')])
    log.append([(3, '{"a":3}')])
    log.close()
    rec, _ = resultlog.parse((tmp_path / "r.log").read_bytes())
    assert [q for q, _ in rec.results] == [1, 3]
    assert (rec.skipped_bytes, rec.torn_bytes) == (0, 0)


def test_a_write_refused_after_a_restart_keeps_the_start_record(tmp_path, monkeypatch):
    """A log started again holds only `S<seq>` (the highest seq given): a write the disk then
    refuses is cut back to it, not past it (the seqs before would be given again)."""
    import errno
    import os

    log = _log_after(tmp_path, b"")
    log.restart(5)
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, bytes(data)[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(resultlog.os, "write", full_disk)
        with pytest.raises(OSError):
            log.append([(6, '{"a":6}')])
    log.close()
    rec, good = resultlog.parse((tmp_path / "r.log").read_bytes())
    assert rec.last_seq == 5 and rec.torn_bytes == 0 and good == len(_line("S5"))


def test_a_log_rewritten_without_its_damage_takes_the_next_line_whole(tmp_path):
    """A damaged line mid-file and a torn tail: the log is rewritten without them, and the
    next append follows the rewritten log's last line (not the old file's length: cutting
    to that would pad the new file with zeros)."""
    path = tmp_path / "r.log"
    lines = [_line(r) for r in ("S0", 'R1 {"a":1}', 'R2 {"a":2}', 'R3 {"a":3}')]
    damaged = lines[2].replace(b'"a":2', b'"a":7')
    path.write_bytes(b"".join([lines[0], lines[1], damaged, lines[3]]) + lines[3][:5])
    log = resultlog.ResultLog(path, sync=False)
    log.recover()
    log.append([(4, '{"a":4}')])
    log.close()
    rec, _ = resultlog.parse(path.read_bytes())
    assert [q for q, _ in rec.results] == [1, 3, 4]
    assert (rec.skipped_bytes, rec.torn_bytes) == (0, 0)
