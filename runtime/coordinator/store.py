"""The coordinator's SQLite store: results exactly once, health history, events.

Results are keyed by (device, stream, seq); `INSERT OR IGNORE` makes re-deliveries free.
Each message is stored under its own SAVEPOINT inside the batch transaction, so one message
that SQLite refuses costs that message (returned for quarantine), never the batch.

Acks are computed from the store inside the same transaction and never from a claim alone: a
result message's `floor` (the lowest seq the device still holds) is used only when the result
with that seq is stored; the ack then vouches for `from` = floor up to the end of the run of
stored seqs from there, and the device deletes only when it holds nothing below `from`. So a
forged floor can neither raise a stream's ack over results that were never stored nor make a
device delete them, and several coordinators sharing one store ack only what is stored.
`streams` keeps the last verified run (`lo`..`acked`, all stored) so the next ack starts there.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    device TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, boot TEXT NOT NULL,
    t REAL NOT NULL, received REAL NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (device, stream, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    device TEXT NOT NULL, stream TEXT NOT NULL, acked INTEGER NOT NULL,
    lo INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (device, stream)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS health (device TEXT NOT NULL, t REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS health_device ON health (device, t);
CREATE TABLE IF NOT EXISTS health_points (device TEXT NOT NULL, t REAL NOT NULL,
    temp_c REAL, passive_trip_c REAL, rung REAL, rungs REAL, p95_ms REAL, target_ms REAL,
    rate_hz REAL, accuracy REAL, power_w REAL, rung_energy_mj REAL, battery_frac REAL,
    harvest_w REAL);
CREATE INDEX IF NOT EXISTS health_points_device ON health_points (device, t);
CREATE TABLE IF NOT EXISTS events (device TEXT NOT NULL, t REAL NOT NULL, type TEXT NOT NULL,
                                   body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_device ON events (device, t);
CREATE TABLE IF NOT EXISTS states (device TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine (t REAL NOT NULL, device TEXT NOT NULL,
                                       topic TEXT NOT NULL, reason TEXT NOT NULL,
                                       size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine_counts (device TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""

# The dashboard's timeline (health_points): column <- path in the health message. Numbers
# only, copied at ingest so a week of a device's timeline is read without parsing JSON.
TIMELINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("temp_c", ("temp_c",)), ("passive_trip_c", ("passive_trip_c",)), ("rung", ("rung",)),
    ("rungs", ("rungs",)), ("p95_ms", ("pipeline", "latency_ms", "p95")),
    ("target_ms", ("slo", "target_ms")), ("rate_hz", ("pipeline", "rate_hz")),
    ("accuracy", ("accuracy",)), ("power_w", ("power_w",)),
    ("rung_energy_mj", ("rung_energy_mj",)), ("battery_frac", ("battery_frac",)),
    ("harvest_w", ("harvest_w",)))
_TIMELINE_COLS = {name for name, _ in TIMELINE}
_AGGREGATES = {"MIN", "MAX", "AVG"}
QUARANTINE_KEEP = 10_000  # rows of detail kept; the per-device counts are kept for ever
SEQ_LIMIT = 1 << 62


@dataclass(frozen=True)
class Inbound:
    """One validated message to store: its device, kind and payload."""

    device: str
    kind: str  # result | health | event | state
    msg: dict


@dataclass(frozen=True)
class Ack:
    """What the coordinator vouches for: every seq in [first, seq] of `stream` is stored."""

    stream: str
    first: int
    seq: int


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
        self._migrate()
        self._lock = threading.Lock()

    def _migrate(self) -> None:
        """Stores made before the verified-ack change lack `streams.lo` (0: recompute)."""
        cols = [r[1] for r in self._db.execute("PRAGMA table_info(streams)")]
        if "lo" not in cols:
            self._db.execute("ALTER TABLE streams ADD COLUMN lo INTEGER NOT NULL DEFAULT 0")

    def ingest(self, messages: Sequence[Inbound]
               ) -> tuple[dict[tuple[str, str], list[Ack]], list[tuple[int, str]]]:
        """Store one batch in one transaction, each message under its own savepoint.

        Returns the acks per (device, stream) touched by results, and (index, reason) of each
        message SQLite refused (the caller quarantines those; the rest of the batch stands)."""
        now = time.time()
        floors: dict[tuple[str, str], set[int]] = {}
        tops: dict[tuple[str, str], int] = {}  # highest seq received per stream in this batch
        refused: list[tuple[int, str]] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for i, m in enumerate(messages):
                    self._db.execute("SAVEPOINT msg")
                    try:
                        self._store_one(m, now)
                    except (sqlite3.Error, ValueError, TypeError, KeyError, OverflowError) as e:
                        self._db.execute("ROLLBACK TO msg")
                        refused.append((i, f"store refused it: {type(e).__name__}: {e}"[:300]))
                    else:
                        if m.kind == "result":
                            key = (m.device, m.msg["stream"])
                            floors.setdefault(key, set()).add(m.msg["floor"])
                            tops[key] = max(tops.get(key, 0),
                                            max(r["seq"] for r in m.msg["results"]))
                    self._db.execute("RELEASE msg")
                acks = {key: self._acks(*key, fl, tops[key]) for key, fl in floors.items()}
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return {k: v for k, v in acks.items() if v}, refused

    def _store_one(self, m: Inbound, now: float) -> None:
        msg = m.msg
        if m.kind == "result":
            rows = []
            for r in msg["results"]:
                seq = r["seq"]
                if not (isinstance(seq, int) and 0 < seq < SEQ_LIMIT):
                    raise ValueError(f"seq {seq!r} outside [1, 2^62)")
                # The boot that produced the result (carried per result), not the re-sender's.
                rows.append((m.device, msg["stream"], seq, r.get("boot") or msg["boot"],
                             float(r["t"]), now, json.dumps(r, separators=(",", ":"))))
            self._db.executemany("INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?)", rows)
        elif m.kind == "health":
            self._db.execute("INSERT INTO health VALUES (?,?,?)",
                             (m.device, float(msg["t"]), json.dumps(msg)))
            self._db.execute(f"INSERT INTO health_points VALUES (?,?{',?' * len(TIMELINE)})",
                             (m.device, float(msg["t"]),
                              *(_number(msg, path) for _, path in TIMELINE)))
        elif m.kind == "event":
            self._db.execute("INSERT INTO events VALUES (?,?,?,?)",
                             (m.device, float(msg["t"]), msg["type"], json.dumps(msg)))
        elif m.kind == "state":
            self._db.execute("INSERT OR REPLACE INTO states VALUES (?,?)",
                             (m.device, json.dumps(msg)))
        else:
            raise ValueError(f"cannot store a {m.kind!r} message")

    def _stored(self, device: str, stream: str, seq: int) -> bool:
        return self._db.execute("SELECT 1 FROM results WHERE device=? AND stream=? AND seq=?",
                                (device, stream, seq)).fetchone() is not None

    def _acks(self, device: str, stream: str, floors: set[int], top: int) -> list[Ack]:
        """One ack per verified floor (normally one); see the module docstring. An ack never
        goes past `top`, the highest seq just received: the device checks acks against what
        it has sent, and after a restart it has not yet re-sent what an earlier run did."""
        out = []
        for floor in sorted(floors)[-4:]:  # a device sends one floor per batch; bound forgeries
            if not self._stored(device, stream, floor):
                continue  # unverified: the device's lowest held result is not here (yet)
            end = self._advance(device, stream, floor)
            if floor <= top:
                out.append(Ack(stream, floor, min(end, top)))
        return out

    def _advance(self, device: str, stream: str, floor: int) -> int:
        """The end of the run of stored seqs from `floor` (which is stored)."""
        row = self._db.execute("SELECT lo, acked FROM streams WHERE device=? AND stream=?",
                               (device, stream)).fetchone()
        if row and 0 < row[0] <= floor <= row[1] + 1:
            lo, acked = row[0], max(row[1], floor)  # a known run (all stored) covers the floor
        else:
            lo, acked = floor, floor
        while True:
            seqs = [q for (q,) in self._db.execute(
                "SELECT seq FROM results WHERE device=? AND stream=? AND seq > ? ORDER BY seq "
                "LIMIT 512", (device, stream, acked))]
            run = 0
            while run < len(seqs) and seqs[run] == acked + 1:
                acked, run = acked + 1, run + 1
            if run < 512:
                break
        self._db.execute("INSERT OR REPLACE INTO streams (device, stream, acked, lo) "
                         "VALUES (?,?,?,?)", (device, stream, acked, lo))
        return acked

    # -- quarantine -----------------------------------------------------------------------------

    def quarantine(self, rows: Sequence[tuple[str, str, str, int, float]]) -> None:
        """Record refused messages: (device or "", topic, reason, size in bytes, time).
        Detail rows are capped at QUARANTINE_KEEP (newest kept); counts are kept for ever."""
        if not rows:
            return
        per_device: dict[str, int] = {}
        for device, *_ in rows:
            per_device[device] = per_device.get(device, 0) + 1
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO quarantine (device, topic, reason, size, t) VALUES (?,?,?,?,?)",
                    [(d[:64], topic[:256], reason[:500], int(size), float(t))
                     for d, topic, reason, size, t in rows])
                self._db.executemany(
                    "INSERT INTO quarantine_counts VALUES (?,?) "
                    "ON CONFLICT(device) DO UPDATE SET n = n + excluded.n",
                    [(d[:64], n) for d, n in per_device.items()])
                self._db.execute("DELETE FROM quarantine WHERE rowid <= "
                                 "(SELECT MAX(rowid) FROM quarantine) - ?", (QUARANTINE_KEEP,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def quarantine_counts(self) -> dict[str, int]:
        """Quarantined messages per device ("" = topic named no valid device)."""
        return dict(self._query("SELECT device, n FROM quarantine_counts"))

    def quarantined(self, device: str | None = None, limit: int = 50) -> list[dict]:
        """The newest quarantined messages (all devices, or one), newest first."""
        where, args = ("WHERE device=?", (device,)) if device is not None else ("", ())
        rows = self._query(f"SELECT t, device, topic, reason, size FROM quarantine {where} "
                           "ORDER BY rowid DESC LIMIT ?", (*args, limit))
        return [{"t": t, "device": d, "topic": tp, "reason": r, "size": n}
                for t, d, tp, r, n in rows]

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

    def health_history(self, device: str, since: float, until: float, limit: int
                       ) -> list[dict]:
        """A device's health in [since, until], oldest first, as the reduced records
        `edgerun report` plots (runtime/health_history.record); more than `limit` are thinned
        to `limit` evenly spread ones (a day at 5 s is 17 280)."""
        from runtime.health_history import record

        rows = self._query("SELECT body FROM health WHERE device=? AND t >= ? AND t <= ? "
                           "ORDER BY t", (device, since, until))
        if len(rows) > limit:
            step = len(rows) / limit
            rows = [rows[int(i * step)] for i in range(limit)]
        out = []
        for (body,) in rows:
            try:
                out.append(record(json.loads(body)))
            except (ValueError, AttributeError):  # stored before validation existed: skip it
                continue
        return out

    def health_series(self, device: str, since: float, until: float,
                      columns: Sequence[tuple[str, str]], max_points: int = 600
                      ) -> list[tuple]:
        """A device's timeline between `since` and `until` (device clock) in at most
        `max_points` time buckets, oldest first: one row per bucket holding its newest `t`
        and, per (TIMELINE column, "MIN" | "MAX" | "AVG") in `columns`, that aggregate over
        the bucket (NULL where the field was absent)."""
        for name, agg in columns:
            if name not in _TIMELINE_COLS or agg not in _AGGREGATES:
                raise ValueError(f"no timeline column {agg}({name})")
        width = max((until - since) / max(1, max_points), 1e-3)
        cols = ", ".join(f"{agg}({name})" for name, agg in columns)
        return self._query(
            f"SELECT MAX(t), {cols} FROM health_points WHERE device=? AND t >= ? AND t <= ? "
            "GROUP BY CAST((t - ?) / ? AS INTEGER) ORDER BY 1",
            (device, since, until, since, width))

    def prune(self, keep_health_s: float, keep_events_s: float) -> None:
        """Drop health and events older than their retention (results are never pruned here)."""
        now = time.time()
        with self._lock:
            self._db.execute("DELETE FROM health WHERE t < ?", (now - keep_health_s,))
            self._db.execute("DELETE FROM health_points WHERE t < ?", (now - keep_health_s,))
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
                    # the timeline goes with the health it was copied from (same order)
                    self._delete("DELETE FROM health_points WHERE rowid IN (SELECT rowid FROM "
                                 "health_points ORDER BY rowid LIMIT ?)", (n,))
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


def _number(msg: Any, path: tuple[str, ...]) -> float | None:
    """The finite number at `path` in a message, else None (a bool, string or NaN where a
    number belongs becomes a gap in the timeline, never an error)."""
    node = msg
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    x = float(node)
    return x if math.isfinite(x) else None
