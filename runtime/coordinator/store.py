"""The coordinator's SQLite store: results exactly once, health history, events.

Results are keyed by (device, stream, seq); `INSERT OR IGNORE` makes re-deliveries free.
The ack for a stream is computed from the store inside the same transaction (the highest seq
below which nothing is missing, raised to the device's `floor - 1` when it reports evicting),
so several coordinator processes sharing one store — one machine, shared subscriptions — ack
only what is really stored.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    device TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, boot TEXT NOT NULL,
    t REAL NOT NULL, received REAL NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (device, stream, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    device TEXT NOT NULL, stream TEXT NOT NULL, acked INTEGER NOT NULL,
    PRIMARY KEY (device, stream)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS health (device TEXT NOT NULL, t REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS health_device ON health (device, t);
CREATE TABLE IF NOT EXISTS events (device TEXT NOT NULL, t REAL NOT NULL, type TEXT NOT NULL,
                                   body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_device ON events (device, t);
CREATE TABLE IF NOT EXISTS states (device TEXT PRIMARY KEY, body TEXT NOT NULL);
"""


class Store:
    """Thread-safe wrapper of one SQLite connection (WAL)."""

    def __init__(self, path: str | Path, fsync: str = "normal"):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync == 'full' else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def ingest(self, results: Sequence[tuple[str, dict]], health: Sequence[tuple[str, dict]],
               events: Sequence[tuple[str, dict]], states: Sequence[tuple[str, dict]]
               ) -> dict[tuple[str, str], int]:
        """Store one batch in one transaction; returns the new ack per (device, stream)
        touched by `results`."""
        now = time.time()
        touched: dict[tuple[str, str], int] = {}  # (device, stream) -> floor
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for device, msg in results:
                    key = (device, msg["stream"])
                    touched[key] = max(touched.get(key, 0), msg["floor"])
                    self._db.executemany(
                        "INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?)",
                        [(device, msg["stream"], r["seq"], msg["boot"], r["t"], now,
                          json.dumps(r, separators=(",", ":"))) for r in msg["results"]])
                self._db.executemany("INSERT INTO health VALUES (?,?,?)",
                                     [(d, h["t"], json.dumps(h)) for d, h in health])
                self._db.executemany("INSERT INTO events VALUES (?,?,?,?)",
                                     [(d, e["t"], e["type"], json.dumps(e)) for d, e in events])
                self._db.executemany("INSERT OR REPLACE INTO states VALUES (?,?)",
                                     [(d, json.dumps(s)) for d, s in states])
                acks = {key: self._advance(*key, floor) for key, floor in touched.items()}
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return acks

    def _advance(self, device: str, stream: str, floor: int) -> int:
        row = self._db.execute("SELECT acked FROM streams WHERE device=? AND stream=?",
                               (device, stream)).fetchone()
        acked = max(row[0] if row else 0, floor - 1)
        while True:
            seqs = [s for (s,) in self._db.execute(
                "SELECT seq FROM results WHERE device=? AND stream=? AND seq > ? ORDER BY seq "
                "LIMIT 512", (device, stream, acked))]
            run = 0
            while run < len(seqs) and seqs[run] == acked + 1:
                acked, run = acked + 1, run + 1
            if run < 512:
                break
        self._db.execute("INSERT OR REPLACE INTO streams VALUES (?,?,?)", (device, stream, acked))
        return acked

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def results(self, device: str, after_seq: int = 0, limit: int = 1000) -> list[dict]:
        """Stored results of a device (all streams), oldest stream first, in seq order."""
        rows = self._query("SELECT stream, boot, body FROM results WHERE device=? AND seq > ? "
                           "ORDER BY received, seq LIMIT ?", (device, after_seq, limit))
        return [{**json.loads(b), "stream": s, "boot": bt} for s, bt, b in rows]

    def results_page(self, device: str, cursor: tuple[str, int] | None = None,
                     limit: int = 1000) -> tuple[list[dict], tuple[str, int] | None]:
        """One page of a device's results in (stream, seq) order, strictly after `cursor`;
        returns (rows, next cursor). Keyset paging on the primary key: no row is skipped or
        repeated however streams interleave. The next cursor is the last row's (or the given
        one when the page is empty, so a client can keep polling from it)."""
        if cursor is None:
            rows = self._query("SELECT stream, seq, boot, body FROM results WHERE device=? "
                               "ORDER BY stream, seq LIMIT ?", (device, limit))
        else:
            rows = self._query("SELECT stream, seq, boot, body FROM results WHERE device=? "
                               "AND (stream, seq) > (?, ?) ORDER BY stream, seq LIMIT ?",
                               (device, cursor[0], cursor[1], limit))
        page = [{**json.loads(b), "stream": s, "boot": bt} for s, _, bt, b in rows]
        return page, ((rows[-1][0], rows[-1][1]) if rows else cursor)

    def result_seqs(self, device: str) -> list[tuple[str, int]]:
        """(stream, seq) of every stored result of a device, in seq order per stream."""
        return self._query("SELECT stream, seq FROM results WHERE device=? ORDER BY stream, seq",
                           (device,))

    def counts(self) -> dict[str, int]:
        """Stored results per device."""
        return dict(self._query("SELECT device, COUNT(*) FROM results GROUP BY device"))

    def acks(self) -> dict[tuple[str, str], int]:
        """The current ack per (device, stream)."""
        return {(d, s): a for d, s, a in self._query("SELECT device, stream, acked FROM streams")}

    def events(self, device: str, limit: int = 50) -> list[dict]:
        """Latest events of a device, newest first."""
        return [json.loads(b) for (b,) in self._query(
            "SELECT body FROM events WHERE device=? ORDER BY t DESC LIMIT ?", (device, limit))]

    def states(self) -> dict[str, dict]:
        """The last state message of every device (to rebuild the fleet view at start)."""
        return {d: json.loads(b) for d, b in self._query("SELECT device, body FROM states")}

    def latest_health(self) -> dict[str, dict]:
        """The newest health of every device."""
        rows = self._query("SELECT device, body, MAX(t) FROM health GROUP BY device")
        return {d: json.loads(b) for d, b, _ in rows}

    def prune(self, keep_health_s: float, keep_events_s: float) -> None:
        """Drop health and events older than their retention (results are never pruned here)."""
        now = time.time()
        with self._lock:
            self._db.execute("DELETE FROM health WHERE t < ?", (now - keep_health_s,))
            self._db.execute("DELETE FROM events WHERE t < ?", (now - keep_events_s,))

    def used_bytes(self) -> int:
        """Bytes of the database in use (pages minus free pages; the file itself keeps its
        high-water mark and reuses the free pages)."""
        (pages,), (free,), (size,) = (self._query(f"PRAGMA {p}") for p in
                                      ("page_count", "freelist_count", "page_size"))
        return (pages[0] - free[0]) * size[0]

    def prune_results(self, max_age_s: float = 0.0, max_bytes: int = 0, chunk: int = 2000,
                      now: float | None = None) -> dict[str, int]:
        """Retention: delete results received more than `max_age_s` ago, then, while the
        store uses more than `max_bytes`, the oldest results, health and events. 0 = off.

        Only results at or below their stream's ack are ever deleted: the ack is kept in
        `streams`, apart from the rows, so pruning cannot lower it, and rows above it are
        still needed to close gaps (deleting them would stall the ack and make the device
        re-send). Works in chunks, each its own short transaction, so ingest is never held
        off for long. Returns counts of what it deleted."""
        now = time.time() if now is None else now
        out = {"results_by_age": 0, "results_by_size": 0, "health_by_size": 0,
               "events_by_size": 0}
        eligible = ("SELECT r.device, r.stream, r.seq FROM results r JOIN streams s "
                    "ON s.device = r.device AND s.stream = r.stream WHERE r.seq <= s.acked")
        if max_age_s > 0:
            while n := self._delete("DELETE FROM results WHERE (device, stream, seq) IN "
                                    f"({eligible} AND r.received < ? LIMIT ?)",
                                    (now - max_age_s, chunk)):
                out["results_by_age"] += n
        if max_bytes > 0:
            for _ in range(10_000):
                used = self.used_bytes()
                if used <= max_bytes:
                    break
                # delete about the share of rows that is over, so a few big rows are not
                # over-pruned in one chunk (the loop re-measures after each)
                (total,), = self._query("SELECT COUNT(*) FROM results")
                share = min(chunk, max(1, int(total * (used - max_bytes) / used) + 1))
                if n := self._delete("DELETE FROM results WHERE (device, stream, seq) IN "
                                     f"({eligible} ORDER BY r.received LIMIT ?)", (share,)):
                    out["results_by_size"] += n
                elif n := self._delete("DELETE FROM health WHERE rowid IN (SELECT rowid FROM "
                                       "health ORDER BY rowid LIMIT ?)", (chunk,)):
                    out["health_by_size"] += n
                elif n := self._delete("DELETE FROM events WHERE rowid IN (SELECT rowid FROM "
                                       "events ORDER BY rowid LIMIT ?)", (chunk,)):
                    out["events_by_size"] += n
                else:
                    break  # only unacked results left: they are kept, whatever the size
        if any(out.values()):
            # The WAL keeps its high-water mark; truncate it so the files on disk shrink too.
            self._query("PRAGMA wal_checkpoint(TRUNCATE)")
        return out

    def _delete(self, sql: str, args: tuple) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
