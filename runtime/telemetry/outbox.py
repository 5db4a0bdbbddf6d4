"""Durable outbox: every result is in SQLite (WAL) before `append` returns.

Three classes of message, each with its own retention:

- results: a per-device `seq` (SQLite AUTOINCREMENT: monotonic, never reused, survives restarts)
  and kept until the coordinator's ack covers it. Past `max_bytes` the oldest are evicted, with an
  `outbox_evicting` event and a persistent counter: losing old results is a decision the operator
  must see, never a silent one.
- health: only the latest `health_keep` wait for the broker (older health is stale anyway).
- events: the latest `event_keep` wait for the broker.

`stream` is a random id made when the database is created; the coordinator de-duplicates by
(device, stream, seq), so a device whose outbox was wiped and restarted at seq 1 is a new stream,
not a flood of duplicates. `boot` is new on every open (one per process start).

One connection guarded by a lock: the pipeline appends, the publisher thread reads and deletes.
SQLite's WAL gives atomic commits, so kill -9 at any point leaves either the whole append or none.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.schema import ConfigError
from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.sidecar import Sidecar

log = logging.getLogger("edgerun.outbox")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS other (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
                                  body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS other_kind ON other (kind, id);
CREATE TABLE IF NOT EXISTS seen_commands (id TEXT PRIMARY KEY, expires REAL NOT NULL);
"""


class OutboxUnavailable(ConfigError):
    """The outbox exists but cannot be opened now (locked, I/O error, not writable); it is
    kept as it is. A ConfigError so `edgerun serve` exits with this one line."""


@dataclass(frozen=True)
class Pending:
    """A result waiting for the coordinator: its seq and its JSON text (seq included)."""

    seq: int
    json: str


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class Outbox:
    """The device's durable queue (see module docstring)."""

    def __init__(self, cfg: OutboxConfig, on_event: Callable[[dict], None] | None = None):
        self.cfg = cfg
        self.path = Path(cfg.path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._on_event = on_event or (lambda e: None)
        self._startup_event: dict | None = None
        self.changes = 0  # bumped on every append/put: readers skip queries when unchanged
        existed = self.path.exists()
        self._db = self._open()
        self.boot = uuid.uuid4().hex[:12]
        self.stream = self._meta("stream") or self._set_meta("stream", uuid.uuid4().hex[:12])
        keep = self.path.with_name(self.path.name + ".keep.json")
        self.sidecar = Sidecar(keep, lost_history=existed and not keep.exists()
                               and self._startup_event is not None)
        if not self.sidecar.problem:
            self._migrate_seen_commands()
        self.evicted_total = max(int(self._meta("evicted_total") or 0),
                                 self.sidecar.evicted_total)
        if self.evicted_total != self.sidecar.evicted_total:
            self.sidecar.set_evicted_total(self.evicted_total)
        if self.sidecar.problem and self._startup_event is None:
            self._startup_event = {"type": "replay_record_lost", "error": self.sidecar.problem}
        self._bytes = self._db.execute("SELECT COALESCE(SUM(LENGTH(body)),0) FROM results"
                                       ).fetchone()[0]

    def _migrate_seen_commands(self) -> None:
        """Ids remembered by an older version inside the database move to the sidecar."""
        now = time.time()
        for cid, expires in self._db.execute("SELECT id, expires FROM seen_commands"
                                             ).fetchall():
            if expires >= now and cid not in self.sidecar.seen:
                self.sidecar.remember(cid, expires)
        self._db.execute("DELETE FROM seen_commands")

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.OperationalError as e:
            # Locked by another process past the busy timeout, an I/O error, cannot be opened
            # or written: none says the file is damaged, and moving a whole outbox aside
            # stranded its unacked results in a .corrupt file no one sends (a lock held 30 s
            # did that). Stop, keep it, say why; systemd starts the daemon again to retry.
            raise OutboxUnavailable(
                f"telemetry.outbox.path {self.path}: cannot open the outbox ({e}); it was left "
                "as it is (not moved aside: this is not corruption); exiting so it is retried"
            ) from e
        except sqlite3.DatabaseError as e:  # not a database, malformed, failed quick_check
            # A corrupt outbox must not keep the device from running: keep the file for
            # forensics, start an empty one, and say so loudly.
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    src.rename(str(aside) + suffix)
            log.error("outbox %s is corrupt (%s); moved it to %s and started an empty outbox",
                      self.path, e, aside)
            self._startup_event = {"type": "outbox_corrupt", "path": str(aside), "error": str(e)}
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if self.cfg.fsync == 'full' else 'NORMAL'}")
        ok = db.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            db.close()
            raise sqlite3.DatabaseError(f"quick_check: {ok}")
        db.executescript(_SCHEMA)
        try:  # writable? (files left root-owned by a `sudo edgerun serve` open read-only, and
            # the first write, later in __init__, raised a traceback instead of this)
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('opened', ?)", (str(time.time()),))
            db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        return db

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT v FROM meta WHERE k=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> str:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))
        return value

    # -- results -------------------------------------------------------------------------------

    def append(self, result: dict) -> int:
        """Store one result durably; returns its seq."""
        return self.append_many([result])[0]

    def append_many(self, results: Sequence[dict]) -> list[int]:
        """Store results in one transaction (one fsync); returns their seqs in order.

        Each result is labelled with this process's `boot` (unless it has one), so a result
        re-sent by a later process is still stored with the boot that produced it."""
        bodies = [_dumps(r if "boot" in r else {**r, "boot": self.boot}) for r in results]
        evicted: tuple[int, int, int] | None = None
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seqs = [self._db.execute("INSERT INTO results (body) VALUES (?)", (b,)).lastrowid
                        for b in bodies]
                self._bytes += sum(len(b) for b in bodies)
                if self._bytes > self.cfg.max_bytes:
                    evicted = self._evict()
                self._db.execute("COMMIT")
                self.changes += 1
            except BaseException:
                self._db.execute("ROLLBACK")
                self._bytes = self._db.execute(
                    "SELECT COALESCE(SUM(LENGTH(body)),0) FROM results").fetchone()[0]
                raise
        if evicted:
            count, first, last = evicted
            log.warning("outbox over %d bytes: evicted %d oldest unacked results (seq %d-%d); "
                        "the coordinator has not acked them",
                        self.cfg.max_bytes, count, first, last)
            self._on_event({"type": "outbox_evicting", "count": count, "first_seq": first,
                            "last_seq": last, "evicted_total": self.evicted_total})
        return seqs  # type: ignore[return-value]

    def _evict(self) -> tuple[int, int, int]:
        """Delete oldest results down to 90% of the cap (inside the caller's transaction)."""
        target = self.cfg.max_bytes * 0.9
        rows = self._db.execute("SELECT seq, LENGTH(body) FROM results ORDER BY seq").fetchall()
        count, first, last = 0, rows[0][0], rows[0][0]
        for seq, size in rows[:-1]:  # never evict the result just written
            if self._bytes <= target:
                break
            self._bytes -= size
            count, last = count + 1, seq
        self._db.execute("DELETE FROM results WHERE seq <= ?", (last,))
        self.evicted_total += count
        self._set_meta("evicted_total", str(self.evicted_total))
        self.sidecar.set_evicted_total(self.evicted_total)
        return count, first, last

    def pending(self, after_seq: int, limit: int) -> list[Pending]:
        """Up to `limit` held results with seq > `after_seq`, in seq order."""
        with self._lock:
            rows = self._db.execute("SELECT seq, body FROM results WHERE seq > ? ORDER BY seq "
                                    "LIMIT ?", (after_seq, limit)).fetchall()
        return [Pending(seq, f'{{"seq":{seq},{body[1:]}' if body != "{}" else f'{{"seq":{seq}}}')
                for seq, body in rows]

    def floor(self) -> int:
        """Lowest seq still held; every seq below it was acked or evicted."""
        with self._lock:
            row = self._db.execute("SELECT MIN(seq) FROM results").fetchone()[0]
        return row if row is not None else self.last_seq() + 1

    def last_seq(self) -> int:
        """The highest seq ever appended (0 for a new outbox)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name='results'"
                                   ).fetchone()
        return row[0] if row else 0

    def ack(self, seq: int) -> int:
        """The coordinator stored everything up to `seq`: drop those; returns how many."""
        with self._lock:
            cur = self._db.execute("DELETE FROM results WHERE seq <= ? RETURNING LENGTH(body)",
                                   (seq,))
            sizes = cur.fetchall()
        self._bytes -= sum(s for (s,) in sizes)
        return len(sizes)

    # -- health and events ---------------------------------------------------------------------

    def put(self, kind: str, message: dict) -> int:
        """Queue a health or event message (bounded per kind); returns its id."""
        keep = self.cfg.health_keep if kind == "health" else self.cfg.event_keep
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            rowid = self._db.execute("INSERT INTO other (kind, body) VALUES (?,?)",
                                     (kind, _dumps(message))).lastrowid
            self._db.execute("DELETE FROM other WHERE kind=? AND id <= ?", (kind, rowid - keep))
            self._db.execute("COMMIT")
            self.changes += 1
        return rowid  # type: ignore[return-value]

    def others(self, limit: int) -> list[tuple[int, str, str]]:
        """Queued (id, kind, json) health/event messages, oldest first."""
        with self._lock:
            return self._db.execute("SELECT id, kind, body FROM other ORDER BY id LIMIT ?",
                                    (limit,)).fetchall()

    def remove(self, ids: Sequence[int]) -> None:
        """The broker accepted these health/event messages."""
        with self._lock:
            self._db.executemany("DELETE FROM other WHERE id=?", [(i,) for i in ids])

    # -- command replay protection (sidecar file, see sidecar.py) ----------------------------

    def remember_command(self, command_id: str, expires: float) -> bool:
        """Record a command id until it expires; False when it was already seen (a replay).
        Kept in the sidecar file, so it survives the outbox being reset."""
        return self.sidecar.remember(command_id, expires)

    def bound_command_memory(self, keep_s: float) -> None:
        """Remember command ids at most `keep_s` ahead (runtime.wire.commands.memory_bound)."""
        self.sidecar.bound(keep_s)

    @property
    def commands_not_before(self) -> float:
        """Commands issued before this time are refused (the replay record was lost then)."""
        return self.sidecar.not_before

    # -- status --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Backlog figures for health: held results, bytes, evictions, next seq."""
        with self._lock:
            held, oldest = self._db.execute("SELECT COUNT(*), MIN(seq) FROM results").fetchone()
        return {"results_held": held, "bytes": self._bytes, "oldest_seq": oldest,
                "evicted_total": self.evicted_total}

    def take_startup_event(self) -> dict | None:
        """An event about what happened while opening (e.g. a corrupt file moved aside)."""
        event, self._startup_event = self._startup_event, None
        return event

    def close(self) -> None:
        """Checkpoint and close."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()
