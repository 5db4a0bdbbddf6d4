"""The outbox's append-only result log: where a result is first made durable.

A result written to SQLite costs whole pages: the WAL frame of every page the transaction
touches (4 KiB + 24 B each), the checkpoint's copy of them into the database, and the ack's
delete does the same again; one result of ~240 bytes a transaction wrote ~14-18 KB (measured,
docs/telemetry.md "Disk writes"). Here a result is one line appended to one file: the bytes of
the line and no more, in order. While the coordinator acks promptly (the normal case) a result
lives only here and never reaches the database; results left unacked for `spill_after_s`, or
more than `spill_bytes` of them, move into the database in one transaction (a broker outage),
and the log starts again.

Lines, each `<crc32 of the rest, 8 hex> <record>\\n`:

- `S<seq>`: the first line of a started-again log: the highest seq ever given (so a log
  emptied by acks never lets a seq be reused);
- `R<seq> <json>`: a result (its JSON without the seq, as the outbox stores it);
- `A<seq>`: the coordinator acked every result up to `seq`.

Durability: `sync` (fsync = "full") fdatasyncs after each append, so a result is on the disk
before `append` returns; without it the line is in the page cache when `append` returns,
which survives a crash of the process (kill -9), as SQLite's synchronous=NORMAL does. Acks are
never synced: a lost ack record only means those results are sent again after a power cut,
and the coordinator stores a (stream, seq) once. A torn last line (a power cut during the
write) fails its checksum: the file is cut back to the last whole line, and what was cut is
reported. A write that fails (a full disk can take part of a line and refuse the rest) cuts
the file back to its last whole line before raising, so later lines never follow a fragment.
A damaged line with whole lines after it (a flipped bit, a bad sector) is skipped, reported
and counted; reading resumes at the next newline (or at a whole record inside the line: a
flipped newline joins two lines) and the seqs of every whole line count towards the highest
given, so none is given again.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from runtime.durable import write_atomic

log = logging.getLogger("edgerun.outbox")


def _line(record: str) -> bytes:
    raw = record.encode()
    return b"%08x " % zlib.crc32(raw) + raw + b"\n"


@dataclass
class Recovered:
    """What a log held when it was opened."""

    last_seq: int = 0  # the highest seq given (S, R and A records), over the whole file
    acked: int = 0  # the highest ack recorded
    results: list[tuple[int, str]] = field(default_factory=list)  # (seq, json) in order
    torn_bytes: int = 0  # bytes after the last whole line, cut off
    skipped_bytes: int = 0  # damaged lines with whole, checked lines after them (lost)
    skipped_lines: int = 0


def _record(raw: bytes) -> tuple[str, int, str] | None:
    """(kind, seq, json) of one line without its newline, or None when it is not a whole,
    checked record."""
    if len(raw) < 10 or raw[8:9] != b" ":
        return None
    body = raw[9:]
    try:
        if int(raw[:8], 16) != zlib.crc32(body):
            return None
        text = body.decode()
        kind, rest = text[0], text[1:]
        if kind == "R":
            seq_s, _, json_text = rest.partition(" ")
            return kind, int(seq_s), json_text
        if kind in ("S", "A"):
            return kind, int(rest), ""
    except (ValueError, UnicodeDecodeError, IndexError):
        pass
    return None


_RECORD_START = re.compile(rb"[0-9a-f]{8} [RSA]")


def _whole_inside(data: bytes, pos: int, nl: int) -> int | None:
    """Where a whole, checked record starts inside the damaged line `data[pos:nl]` and runs
    to its end (the line after a newline a flipped bit turned into another byte), or None.
    The first few candidates only: each costs a checksum of the rest of the line, and a
    line full of record-like text must not make recovery quadratic."""
    m = _RECORD_START.search(data, pos + 1, nl)
    for _ in range(8):
        if m is None:
            return None
        if _record(data[m.start():nl]) is not None:
            return m.start()
        m = _RECORD_START.search(data, m.start() + 1, nl)
    return None


def parse(data: bytes) -> tuple[Recovered, int]:
    """The records of a log's bytes, and the length up to the end of its last whole, checked
    line. A damaged line (a flipped bit) is skipped and reading resumes at the next newline,
    so one bad line costs that line, not every result after it; damage with no whole line
    after it is the torn tail of a cut write."""
    rec = Recovered()
    good = 0  # end of the last whole, checked line
    pos = 0
    unseen = 0  # records a skipped line may have held: their seqs may have been given
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        got = _record(data[pos:nl]) if nl >= 0 else None
        if got is None and nl >= 0 and (at := _whole_inside(data, pos, nl)) is not None:
            pos = at  # a flipped newline joined two lines: the second is whole, read it
            continue
        if got is not None:
            kind, seq, json_text = got
            if kind == "R":
                rec.results.append((seq, json_text))
            elif kind == "A":
                rec.acked = max(rec.acked, seq)
            rec.last_seq = max(rec.last_seq, seq)
            if pos > good:  # damaged lines between two whole ones
                damaged = data[good:pos]
                rec.skipped_bytes += len(damaged)
                rec.skipped_lines += max(1, damaged.count(b"\n"))  # one without its newline
                unseen += max(damaged.count(b"\n"), len(_RECORD_START.findall(damaged)))
            if kind in ("R", "S"):  # above every seq written before it
                unseen = 0
            good = end
        pos = end
    # A skipped line was whole once and lines were written after it: a result there may have
    # been published, so its seq is never given again, even with only acks after it (a gap
    # in seqs costs nothing; a seq given twice is dropped by the coordinator as a duplicate).
    # A torn tail's write never finished, so its seq was never given.
    rec.last_seq += unseen
    rec.torn_bytes = len(data) - good
    rec.results.sort()  # in seq order whatever a damaged line did to the file's order
    return rec, good


def read(path: Path) -> Recovered:
    """A log's records, read-only (tests, tools); an absent log is empty."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Recovered()
    return parse(data)[0]


class ResultLog:
    """One append-only log file (see the module docstring); the outbox's lock guards it."""

    def __init__(self, path: Path, sync: bool):
        self.path = path
        self.sync = sync
        self._fd: int | None = None
        self.size = 0  # bytes of whole lines: where the next line starts
        self._cut = False  # a failed write's fragment may follow `size`: cut before writing

    def recover(self) -> Recovered:
        """Read the log, cut a torn tail off, and open it for appending."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        rec, good = parse(data)
        if rec.skipped_bytes:
            log.error("outbox log %s: %d damaged lines (%d bytes) between whole records were "
                      "skipped (their checksums fail: a bad sector or a flipped bit); a result "
                      "in them is lost, the %d results around them are kept", self.path,
                      rec.skipped_lines, rec.skipped_bytes, len(rec.results))
            good = self._drop_damage(rec, good)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if rec.torn_bytes:
            log.warning("outbox log %s: cut off %d bytes after the last whole record: a write "
                        "cut short by a crash, a power cut or a full disk. Nothing a finished "
                        "append stored is in them, except after a power cut with fsync = "
                        "\"normal\" (then the last results written, as SQLite's "
                        "synchronous=NORMAL loses them)", self.path, rec.torn_bytes)
            os.ftruncate(self._fd, good)
            if self.sync:
                os.fsync(self._fd)
        self.size = good
        self._cut = False
        return rec

    def _drop_damage(self, rec: Recovered, good: int) -> int:
        """Rewrite the log as its whole records alone (the highest seq given, the ack, the
        unacked results), so damage is reported once, not at every start until the log
        next restarts; the new length, or `good` when the disk refuses (said again then)."""
        raw = _line(f"S{rec.last_seq}") + (_line(f"A{rec.acked}") if rec.acked else b"") + \
            b"".join(_line(f"R{seq} {body}") for seq, body in rec.results if seq > rec.acked)
        try:
            write_atomic(self.path, raw, mode=0o600)
        except OSError as e:
            log.warning("outbox log %s: could not rewrite it without the damaged lines (%s); "
                        "they are skipped again at the next start", self.path, e)
            return good
        return len(raw)

    def _write(self, raw: bytes, sync: bool) -> None:
        """Append `raw` whole or not at all: on any error (a full disk takes part of a line,
        then refuses the rest) the file is cut back to its last whole line before raising.
        A fragment left there ended the log at the next start: every result appended after
        it was cut off with it, and their seqs were given again."""
        assert self._fd is not None, "recover() opens the log"
        try:
            if self._cut:  # an earlier cut back failed: lines must not follow a fragment
                os.ftruncate(self._fd, self.size)
                self._cut = False
            view = memoryview(raw)
            while view:
                view = view[os.write(self._fd, view):]
            if sync:
                os.fdatasync(self._fd)
        except OSError:
            try:  # shrinking a file needs no free space
                os.ftruncate(self._fd, self.size)
            except OSError:
                self._cut = True
            raise
        self.size += len(raw)

    def append(self, results: list[tuple[int, str]]) -> None:
        """Append results (seq, json) in one write; durable as `sync` says when it returns.
        Raises OSError (a full disk: the outbox then holds them in memory)."""
        self._write(b"".join(_line(f"R{seq} {body}") for seq, body in results), self.sync)

    def ack(self, seq: int) -> None:
        """Record an ack (never synced: see the module docstring)."""
        self._write(_line(f"A{seq}"), False)

    def restart(self, last_seq: int) -> None:
        """Replace the log by one holding only `S<last_seq>` (every result in it is acked or in
        the database): written beside it, synced and renamed over it, so a crash leaves the
        old log or the new one."""
        write_atomic(self.path, _line(f"S{last_seq}"), mode=0o600)
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = self.path.stat().st_size
        self._cut = False

    def restart_in_place(self, last_seq: int) -> None:
        """`restart` for a disk that cannot take the copy beside the log (full, and the acked
        log may be what fills it): `S<last_seq>` written over the log's head, the rest cut
        off, synced. Never truncated first: a crash between would leave no `S` record and
        let seqs the coordinator has seen be given again. A crash after the write and before
        the cut leaves the `S` record, a damaged line (reported, skipped) and the old
        records, every one acked or in the database."""
        rec = _line(f"S{last_seq}")
        fd = os.open(self.path, os.O_WRONLY)  # not O_APPEND: Linux appends any pwrite on it
        try:
            os.pwrite(fd, rec, 0)
            os.ftruncate(fd, len(rec))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.size = len(rec)
        self._cut = False

    def close(self) -> None:
        """Close the file (what it holds stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
