"""What the outbox holds in memory while its disk refuses writes (full, an I/O error, a file size
limit), so that a full state directory degrades the device instead of ending it.

While the outbox cannot write (`unwritable` says which errors mean that: they pass when space
returns, unlike a bug or a corrupt file), results, health and events wait here, bounded:

- results get their seqs at once (continuing the database's, so nothing is reordered) and wait
  up to `max_bytes` of JSON; past it new results are refused (`OutboxFull`, counted in
  `refused_total`): the held ones stay contiguous, so acks keep working when they reach disk.
  They are not published before they are on disk: a result is durable before it is sent, and
  seqs the coordinator has seen are never reused after a restart.
- health and events keep the latest `health_keep` / `event_keep` and are published from memory
  (with ids continuing the database's), so the operator hears about the full disk at once.
- an ack or a delete the disk refused waits too, and is applied with the next flush.

The outbox retries a flush (one transaction: acks, deletes, results, messages) at most every
`retry_s`, on its next write. Everything here is plain data; outbox.py owns the lock.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections import deque
from dataclasses import dataclass, field

# sqlite3 primary result codes (extended codes keep them in the low byte)
SQLITE_IOERR = 10
SQLITE_FULL = 13
# EROFS: ext4 mounted errors=remount-ro (a Raspberry Pi's root) turns read-only under the open
# files when the card fails; results wait in memory as on a full disk, saying so, instead of
# each append being lost with an error
_OS_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


class OutboxFull(OSError):
    """The disk refuses writes and the memory bound is reached: these results are not kept."""


def unwritable(e: BaseException) -> bool:
    """True for an error of the storage that passes when space returns (disk or quota full, a
    file size limit, an I/O error, a filesystem turned read-only); False for anything else
    (a bug, a corrupt database)."""
    if isinstance(e, sqlite3.OperationalError):
        code = getattr(e, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in (SQLITE_FULL, SQLITE_IOERR)
        return "disk is full" in str(e) or "disk I/O error" in str(e)
    return isinstance(e, OSError) and e.errno in _OS_FULL


@dataclass
class Held:
    """The memory side of a degraded outbox (see the module docstring)."""

    max_bytes: int
    retry_s: float
    since: float | None = None  # wall time the disk first refused a write; None: writable
    error: str = ""
    results: list[tuple[int, str]] = field(default_factory=list)  # (seq, JSON without seq)
    others: dict[str, deque] = field(default_factory=dict)  # kind -> (id, kind, JSON)
    acked_upto: int = 0  # an ack the disk refused to apply
    removed: set[int] = field(default_factory=set)  # published messages still in the database
    bytes: int = 0
    refused_total: int = 0  # results refused past max_bytes (ever, this process)
    episodes: int = 0  # times the disk became unwritable (this process)
    next_try: float = 0.0  # monotonic time of the next flush attempt
    since_mono: float = 0.0  # monotonic time the episode began: its length (a wall step
    # during it, an NTP sync on a box without an RTC, made a week of a second's outage)

    @property
    def active(self) -> bool:
        """The disk refused a write and nothing has been flushed since."""
        return self.since is not None

    def start(self, e: BaseException, now: float) -> bool:
        """Record the refusal `e`; True when it starts a new episode (raise the event)."""
        self.error = str(e)[:300]
        self.next_try = time.monotonic() + self.retry_s
        if self.since is None:
            self.since, self.episodes = now, self.episodes + 1
            self.since_mono = time.monotonic()
            return True
        return False

    def due(self) -> bool:
        """Time to try writing to the disk again."""
        return time.monotonic() >= self.next_try

    def failed_again(self, e: BaseException) -> None:
        """A flush failed: wait `retry_s` before the next."""
        self.error = str(e)[:300]
        self.next_try = time.monotonic() + self.retry_s

    def room(self, bodies: list[str]) -> bool:
        """These result bodies fit under the memory bound."""
        return self.bytes + sum(len(b) for b in bodies) <= self.max_bytes

    def add_results(self, first_seq: int, bodies: list[str]) -> list[int]:
        """Hold `bodies` as seqs first_seq.. ; returns the seqs."""
        seqs = list(range(first_seq, first_seq + len(bodies)))
        self.results.extend(zip(seqs, bodies, strict=True))
        self.bytes += sum(len(b) for b in bodies)
        return seqs

    def add_other(self, rowid: int, kind: str, body: str, keep: int) -> None:
        """Hold a health/event message; only the latest `keep` of its kind."""
        q = self.others.setdefault(kind, deque(maxlen=keep))
        q.append((rowid, kind, body))

    def other_rows(self) -> list[tuple[int, str, str]]:
        """Held messages, oldest first."""
        return sorted((r for q in self.others.values() for r in q), key=lambda r: r[0])

    def drop_others(self, ids: set[int]) -> set[int]:
        """Forget held messages the broker took; returns the ids that were not held."""
        held = {r[0] for q in self.others.values() for r in q}
        for kind, q in self.others.items():
            self.others[kind] = deque((r for r in q if r[0] not in ids), maxlen=q.maxlen)
        return ids - held

    def last_seq(self) -> int:
        """The highest seq held, 0 for none."""
        return self.results[-1][0] if self.results else 0

    def last_other(self) -> int:
        """The highest message id held, 0 for none."""
        return max((r[0] for q in self.others.values() for r in q), default=0)

    def clear(self) -> dict:
        """Everything reached the disk: back to normal; returns the episode's figures."""
        done = {"results": len(self.results),
                "down_s": round(time.monotonic() - self.since_mono, 1),
                "refused_total": self.refused_total}
        self.since, self.error = None, ""
        self.results, self.others, self.removed = [], {}, set()
        self.acked_upto, self.bytes = 0, 0
        return done

    def status(self) -> dict:
        """The health fields (backlog): whether the disk refuses writes and what waits."""
        return {"disk_full": self.active, "held_in_memory": len(self.results),
                "held_bytes": self.bytes, "refused_full_total": self.refused_total}
