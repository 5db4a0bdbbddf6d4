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
write) fails its checksum: reading stops there, the file is cut back to the last whole line,
and what was cut is reported; such a result's `append` had not returned.
"""

from __future__ import annotations

import logging
import os
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

    last_seq: int = 0  # the highest seq given (S, R and A records)
    acked: int = 0  # the highest ack recorded
    results: list[tuple[int, str]] = field(default_factory=list)  # (seq, json) in order
    torn_bytes: int = 0  # bytes after the last whole line, cut off


def parse(data: bytes) -> tuple[Recovered, int]:
    """The records of a log's bytes, and the length of its whole, checked lines."""
    rec = Recovered()
    good = 0
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n") or len(raw) < 11 or raw[8:9] != b" ":
            break
        body = raw[9:-1]
        try:
            if int(raw[:8], 16) != zlib.crc32(body):
                break
            text = body.decode()
            kind, rest = text[0], text[1:]
            if kind == "R":
                seq_s, _, json_text = rest.partition(" ")
                seq = int(seq_s)
                rec.results.append((seq, json_text))
            elif kind in "SA":
                seq = int(rest)
                if kind == "A":
                    rec.acked = max(rec.acked, seq)
            else:
                break
        except (ValueError, UnicodeDecodeError, IndexError):
            break
        rec.last_seq = max(rec.last_seq, seq)
        good += len(raw)
    rec.torn_bytes = len(data) - good
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
        self.size = 0

    def recover(self) -> Recovered:
        """Read the log, cut a torn tail off, and open it for appending."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        rec, good = parse(data)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if rec.torn_bytes:
            log.warning("outbox log %s: %d bytes after the last whole record (a write cut by a "
                        "crash or power loss; its append had not returned) were cut off",
                        self.path, rec.torn_bytes)
            os.ftruncate(self._fd, good)
            if self.sync:
                os.fsync(self._fd)
        self.size = good
        return rec

    def _write(self, raw: bytes, sync: bool) -> None:
        assert self._fd is not None, "recover() opens the log"
        view = memoryview(raw)
        while view:
            view = view[os.write(self._fd, view):]
        self.size += len(raw)
        if sync:
            os.fdatasync(self._fd)

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

    def close(self) -> None:
        """Close the file (what it holds stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
