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

The same class speaks SQLite (a path; the embedded default) and PostgreSQL (a
`postgresql://` URL): the SQL here is written once, portably (`?` placeholders, `ON CONFLICT`),
and what differs — connections, DDL and migrations, exactly-once insert of results, locking,
time partitions, size — is in dialect.py. A method added here in portable SQL works on both;
tests/coordinator/test_store_backends.py runs the store tests against both.

Fair shares (quotas.py): `pool_usage` keeps each device's logical bytes per pool (results,
health, events), maintained by ingest and every delete; with a cap (`set_cap`) a device past
its quota of a pool in a full store sheds its own oldest rows of it before its batch is
written (or the message is refused), retention reclaims from the pool most over its quota
before anyone else's data, and a stream whose ack never moves is quarantined
(`quarantine_stalled`). docs/fleet-scale.md.

Fleet views live in tables, so every coordinator sharing the store answers the same:
`devices` (the merged view of each device, updated in the storing transaction with the pure
functions of fleet.py) and `result_counts` (results per device, maintained by ingest and
retention, so `fleet ls` never counts the results table).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.coordinator import fleet, quotas
from runtime.coordinator.dialect import open_dialect
from runtime.wire import clock

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
_TIMELINE_SQL = ", ".join(("device", "t", *(name for name, _ in TIMELINE)))
_AGGREGATES = {"MIN", "MAX", "AVG"}
QUARANTINE_KEEP = 10_000  # rows of detail kept; the per-device counts are kept for ever
# and of one device's: a device flooding refused messages erases only its own record (was:
# every other device's too, past QUARANTINE_KEEP)
QUARANTINE_PER_DEVICE = 1000
# A device's streams (one per outbox it ever had: a new one after a reinstall or a damaged
# outbox): rows never deleted and outside its fair share, so bounded here. Past this a
# result on a new stream is refused (quarantined, naming the device).
MAX_STREAMS_PER_DEVICE = 256
# `last_seen` alone moving rewrites a device's `devices` row at most this often (seconds)
LAST_SEEN_WRITE_S = 5.0
SEQ_LIMIT = 1 << 62
# a device's oldest acked results (device, limit): what admission and retention take first
_ACKED_OLDEST = ("SELECT r.device, r.stream, r.seq FROM results r JOIN streams s ON "
                 "s.device = r.device AND s.stream = r.stream WHERE r.device = ? AND "
                 "r.seq <= s.acked ORDER BY r.received LIMIT ?")


@dataclass(frozen=True)
class Inbound:
    """One validated message to store: its device, kind and payload."""

    device: str
    kind: str  # result | health | event | state
    msg: dict
    size: int = 0  # its bytes on the wire (0: estimated from msg when a quota needs it)


@dataclass(frozen=True)
class Stalled:
    """A stream quarantined by retention: its ack stopped and its rows above it were
    deleted (the device still holds them: it deletes only what an ack covers)."""

    device: str
    stream: str
    acked: int
    rows: int
    bytes: int
    since: float


@dataclass(frozen=True)
class Ack:
    """What the coordinator vouches for: every seq in [first, seq] of `stream` is stored."""

    stream: str
    first: int
    seq: int


class _Redo(Exception):
    """The fast path (no savepoints) hit a message the store refuses: redo with savepoints."""


class Store:
    """The coordinator's store on SQLite (a path) or PostgreSQL (a URL); thread-safe."""

    def __init__(self, path: str | Path, fsync: str = "normal", margin: float = 0.25):
        self._d = open_dialect(path, fsync)
        # (was: what devices over their share might borrow past the budget; admission now
        # sheds before write, so nothing is borrowed past it: kept for callers' signature)
        self.margin = margin
        self.over_budget = False  # the last batch found the devices over their budget
        # a device's `devices` row is not rewritten for a `last_seen` that moved less than
        # this (the coordinator sets it from stale_after_s)
        self.last_seen_write_s = LAST_SEEN_WRITE_S
        self.backend = self._d.name
        # fair shares (quotas.py): the devices' logical budget, 0 = no cap; set_cap sets it
        self._budget, self._ratio = 0, 1.0
        # set_cap: the cap, the bundle shelf's bytes in it, whether a ratio was measured
        self._cap, self._reserved, self._measured = 0, 0, False
        self.refused_over_share: Counter = Counter()  # messages refused, per device
        # rows admission shed before writing, per (device, pool) (read and reset by retention)
        self.shed: Counter = Counter()
        self._batch_shed: Counter = Counter()
        self._shed_lock = threading.Lock()
        self._total = 0  # the devices' logical bytes after the last batch admitted
        # streams known to exist, per device (bounded by MAX_STREAMS_PER_DEVICE each): a
        # result on one of these needs no query to check the cap
        self._streams_seen: dict[str, set[str]] = {}
        # what the last prune_results reclaimed from devices over their share: device ->
        # {"results": n, "unacked": n, "health": n, "events": n, "before": B, "after": B}
        self.reclaimed: dict[str, dict[str, int]] = {}
        if self.backend == "sqlite":  # the raw connection, for tests that forge rows
            self.path, self._db, self._lock = self._d.path, self._d.db, self._d.lock

    def ingest(self, messages: Sequence[Inbound],
               written: dict[str, tuple[float, fleet.DeviceView]] | None = None
               ) -> tuple[dict[tuple[str, str], list[Ack]], list[tuple[int, str]]]:
        """Store one batch in one transaction; a message the store refuses costs only itself.

        The batch is first tried without savepoints (one round trip less per message on a
        server); if any message is refused it is redone with one savepoint per message.
        Returns the acks per (device, stream) touched by results, and (index, reason) of each
        message refused (the caller quarantines those; the rest of the batch stands): by the
        store, or by the fair shares (a device over its share of a full store).
        `written`, when given, receives each stored device's merged view as written to
        `devices` and its `updated` stamp (the coordinator then needs not read it back)."""
        if not messages:
            return {}, []
        for savepoints in (False, True):
            for attempt in range(3):
                try:
                    if written is not None:
                        written.clear()  # a retried attempt writes again
                    return self._ingest(messages, savepoints, written)
                except _Redo:
                    break
                except self._d.retryable:
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def _ingest(self, messages: Sequence[Inbound], savepoints: bool,
                written: dict[str, tuple[float, fleet.DeviceView]] | None = None
                ) -> tuple[dict[tuple[str, str], list[Ack]], list[tuple[int, str]]]:
        now = time.time()
        floors: dict[tuple[str, str], set[int]] = {}
        tops: dict[tuple[str, str], int] = {}  # highest seq received per stream in this batch
        refused: list[tuple[int, str]] = []
        new_per_device: Counter = Counter()
        bytes_per_device: Counter = Counter()
        stored: list[Inbound] = []
        with self._d.transaction() as db:
            # Serialises this batch's devices against other coordinators (PostgreSQL) so
            # their acks and views see every committed result.
            self._d.lock_devices(db, [m.device for m in messages])
            admitted, refused = self._admit(db, messages)
            over_share = list(refused)
            admitted = self._cap_streams(db, messages, admitted, refused)
            if not savepoints:
                try:
                    new_per_device, bytes_per_device = self._store_all(
                        db, [messages[i] for i in admitted], now)
                except (*self._d.errors, ValueError, TypeError, KeyError, OverflowError) as e:
                    raise _Redo from e
                stored = [messages[i] for i in admitted]
            for i in admitted if savepoints else ():
                m = messages[i]
                db.execute("SAVEPOINT msg")
                try:
                    new, size = self._store_one(db, m, now)
                except (*self._d.errors, ValueError, TypeError, KeyError, OverflowError) as e:
                    db.execute("ROLLBACK TO SAVEPOINT msg")
                    refused.append((i, f"store refused it: {type(e).__name__}: {e}"[:300]))
                else:
                    new_per_device[m.device] += new
                    bytes_per_device[m.device, quotas.pool_of(m.kind)] += size
                    stored.append(m)
                db.execute("RELEASE SAVEPOINT msg")
            _charge(db, bytes_per_device)
            for m in stored:
                if m.kind == "result":
                    key = (m.device, m.msg["stream"])
                    floors.setdefault(key, set()).add(m.msg["floor"])
                    tops[key] = max(tops.get(key, 0), max(r["seq"] for r in m.msg["results"]))
            if new_per_device:
                db.executemany("INSERT INTO result_counts VALUES (?,?) ON CONFLICT(device) "
                               "DO UPDATE SET n = result_counts.n + excluded.n",
                               sorted((d, n) for d, n in new_per_device.items() if n))
            self._merge_views(db, stored, now, written)
            acks = self._acks_batch(db, floors, tops)
            # a stream whose floor is not stored has not moved its ack: remembered from the
            # first such batch on, so retention can quarantine one that never moves again
            # (quarantine_stalled); the first stall's time and ack are kept
            stalled = sorted(k for k, v in acks.items() if not v)
            if stalled:
                db.executemany("INSERT INTO stalls VALUES (?, ?, ?, COALESCE((SELECT acked "
                               "FROM streams WHERE device = ? AND stream = ?), 0)) "
                               "ON CONFLICT(device, stream) DO NOTHING",
                               [(d, st, now, d, st) for d, st in stalled])
        for i, _ in over_share:  # counted once the batch is committed (not per retry)
            self.refused_over_share[messages[i].device] += 1
        if self._batch_shed:
            with self._shed_lock:
                self.shed.update(self._batch_shed)
        if self._budget > 0 and (self.backend == "sqlite" or not self._measured):
            # the file's bytes per logical byte move with the rows' mix and with the pages
            # deletes leave part-filled: measured after each batch (three PRAGMAs), so the
            # next batch is admitted against the file as it is, not as the last pass saw it
            self._measure(self._total)
        return {k: v for k, v in acks.items() if v}, sorted(refused)

    def _admit(self, db: Any, messages: Sequence[Inbound]
               ) -> tuple[list[int], list[tuple[int, str]]]:
        """(indexes admitted, (index, reason) refused) under the pools of quotas.py, decided
        before anything of the batch is written: a device past its quota of a pool in a full
        store sheds its own oldest rows of that pool first (`_shed`, in this transaction),
        and a message it cannot make room for (its results not yet acked) is refused.
        Everything is admitted when there is no cap. Reads the pools of the batch's devices
        (locked by lock_devices) and the store's total in the storing transaction."""
        if self._budget <= 0:
            return list(range(len(messages))), []
        devices = sorted({m.device for m in messages})
        match, args = self._d.in_list(devices)
        have: Counter = Counter({(d, p): int(b) for d, p, b in db.execute(
            f"SELECT device, pool, bytes FROM pool_usage WHERE device{match}", args).fetchall()})
        total, held = (int(x) for x in db.execute(
            "SELECT COALESCE(SUM(bytes), 0), COUNT(DISTINCT device) FROM pool_usage "
            "WHERE bytes > 0").fetchone())
        holding = {d for (d, _), b in have.items() if b > 0}
        self._batch_shed = Counter()  # added to `shed` once the batch is committed
        admitted, refused = [], []
        for i, m in enumerate(messages):
            pool = quotas.pool_of(m.kind)
            if pool is None:  # a state: one row a device, replaced, not charged
                admitted.append(i)
                continue
            size = self._charge_of(m)
            devices_n = held + (m.device not in holding)
            shed = quotas.admit(have[m.device, pool], size, total, devices_n, self._budget,
                                pool)
            if shed > 0:
                rows, freed = self._shed(db, m.device, pool, shed)
                have[m.device, pool] -= freed
                total -= freed
                self._batch_shed[m.device, pool] += rows
                if freed < shed:
                    refused.append((i, quotas.refusal(m.device, pool, have[m.device, pool],
                                                      self._budget, devices_n)))
                    continue
            admitted.append(i)
            if m.device not in holding:
                holding.add(m.device)
                held += 1
            have[m.device, pool] += size
            total += size
        self.over_budget, self._total = total > self._budget, total
        return admitted, refused

    def _charge_of(self, m: Inbound) -> int:
        """What storing `m` charges its device's pool, from above (results: quotas.py's
        estimate; health and events: exactly, their bodies as stored)."""
        if m.kind == "health":
            return quotas.health_bytes(m.device, json.dumps(m.msg))
        if m.kind == "event":
            return quotas.event_bytes(m.device, str(m.msg.get("type", "")), json.dumps(m.msg))
        return quotas.message_bytes(m.device, m.kind, m.msg, m.size or len(
            json.dumps(m.msg, separators=(",", ":"))))

    def _shed(self, db: Any, device: str, pool: str, need: int) -> tuple[int, int]:
        """Delete `device`'s oldest rows of `pool` inside the storing transaction until `need`
        logical bytes are freed or nothing more may go (results: only acked ones; events:
        never the record of a quarantine); returns (rows, bytes) deleted."""
        rows = freed = 0
        while freed < need:
            per_row = max(1, self._pool_row_bytes(db, device, pool))
            limit = min(2000, (need - freed) // per_row + 1)
            if pool == "results":
                gone = [int(r[3]) for r in self._delete_in(db, _ACKED_OLDEST, (device, limit))]
            else:
                gone = self._delete_oldest(db, pool, device, limit)
            if not gone:
                break
            rows, freed = rows + len(gone), freed + sum(gone)
        return rows, freed

    def _pool_row_bytes(self, db: Any, device: str, pool: str) -> int:
        """The mean logical bytes of a row of `device`'s `pool` (from the maintained counts
        where there are any; else one row's, read)."""
        if pool == "results":
            row = db.execute("SELECT u.bytes, c.n FROM pool_usage u JOIN result_counts c ON "
                             "c.device = u.device WHERE u.device = ? AND u.pool = 'results'",
                             (device,)).fetchone()
            if row and row[1]:
                return int(row[0]) // int(row[1])
        table = "results" if pool == "results" else pool
        row = db.execute(f"SELECT {quotas.POOL_BYTES_SQL[pool]} FROM {table} WHERE device = ? "
                         "LIMIT 1", (device,)).fetchone()
        return int(row[0]) if row else 1

    def _delete_oldest(self, db: Any, pool: str, device: str, limit: int) -> list[int]:
        """Delete `device`'s `limit` oldest health rows (with their timeline rows) or events
        (never a `stream_quarantined`: the operator needs it) in `db`; their logical bytes."""
        oc = self._d.order_col
        keep = " AND type <> 'stream_quarantined'" if pool == "events" else ""
        gone = [int(n) for (n,) in db.execute(
            f"DELETE FROM {pool} WHERE {oc} IN (SELECT {oc} FROM {pool} WHERE device = ?{keep} "
            f"ORDER BY t LIMIT ?) RETURNING {quotas.POOL_BYTES_SQL[pool]}",
            (device, limit)).fetchall()]
        if gone and pool == "health":
            db.execute(f"DELETE FROM health_points WHERE {oc} IN (SELECT {oc} FROM "
                       "health_points WHERE device = ? ORDER BY t LIMIT ?)",
                       (device, len(gone)))
        _uncharge(db, Counter({(device, pool): sum(gone)}))
        return gone

    def _cap_streams(self, db: Any, messages: Sequence[Inbound], admitted: list[int],
                     refused: list[tuple[int, str]]) -> list[int]:
        """`admitted` less the results on a new stream of a device that has
        MAX_STREAMS_PER_DEVICE already (appended to `refused` with the reason)."""
        seen = self._streams_seen
        devices = sorted({m.device for i in admitted if (m := messages[i]).kind == "result"
                          and m.msg["stream"] not in seen.get(m.device, ())})
        if not devices:  # the usual batch: every stream known already
            return admitted
        match, args = self._d.in_list(devices)
        have: dict[str, set[str]] = {d: set() for d in devices}
        for d, st in db.execute(  # acked streams, and those still waiting for their floor
                f"SELECT device, stream FROM streams WHERE device{match} UNION "
                f"SELECT device, stream FROM stalls WHERE device{match}", args + args).fetchall():
            have[d].add(st)
        seen.update(have)
        keep = []
        for i in admitted:
            m = messages[i]
            if m.kind == "result" and m.device in have and \
                    m.msg["stream"] not in (known := have[m.device]):
                if len(known) >= MAX_STREAMS_PER_DEVICE:
                    refused.append((i, f"device {m.device}: has {len(known)} streams, the "
                                       f"most a device may; a result on a new one is refused"))
                    continue
                known.add(m.msg["stream"])
            keep.append(i)
        return keep

    def _store_all(self, db: Any, messages: Sequence[Inbound], now: float
                   ) -> tuple[Counter, Counter]:
        """The whole batch in a few statements (one per kind; the dialect inserts results
        in one or two); returns new results and their logical bytes (quotas.py) per device.
        Raises on the first bad message."""
        results, health, events, states, timeline = [], [], [], [], []
        size: Counter = Counter()
        for m in messages:
            msg = m.msg
            if m.kind == "result":
                results.extend(_result_rows(m, now))
            elif m.kind == "health":
                health.append((m.device, float(msg["t"]), body := json.dumps(msg)))
                timeline.append(_timeline_row(m.device, msg))
                size[m.device, "health"] += quotas.health_bytes(m.device, body)
            elif m.kind == "event":
                events.append((m.device, float(msg["t"]), msg["type"],
                               body := json.dumps(msg)))
                size[m.device, "events"] += quotas.event_bytes(m.device, msg["type"], body)
            elif m.kind == "state":
                states.append((m.device, json.dumps(msg)))
            else:
                raise ValueError(f"cannot store a {m.kind!r} message")
        if health:
            self._d.insert_rows(db, "health", ("device", "t", "body"),
                                ("text", "float8", "text"), health)
            self._d.insert_rows(db, "health_points", _TIMELINE_SQL.split(", "),
                                ("text", "float8", *("float8",) * len(TIMELINE)), timeline)
        if events:
            self._d.insert_rows(db, "events", ("device", "t", "type", "body"),
                                ("text", "float8", "text", "text"), events)
        if states:
            self._d.upsert_states(db, states)
        new = self._d.insert_results(db, results)
        for r in new:
            size[r[0], "results"] += quotas.result_bytes(r[0], r[1], r[3], r[6])
        return Counter(r[0] for r in new), size

    def _acks_batch(self, db: Any, floors: dict[tuple[str, str], set[int]],
                    tops: dict[tuple[str, str], int]) -> dict[tuple[str, str], list[Ack]]:
        """`_acks` for every stream of the batch with three statements in all: the streams'
        rows, the stored seqs from each one's ack on (up to 512), the new rows. A stream
        whose answer is not within that window falls back to `_acks` (exact, more queries)."""
        if not floors:
            return {}
        match, args = self._d.in_list(sorted({d for d, _ in floors}))
        rows = {(d, s): (lo, a) for d, s, lo, a in db.execute(
            f"SELECT device, stream, lo, acked FROM streams WHERE device{match}",
            args).fetchall() if (d, s) in floors}
        starts = {k: rows[k][1] + 1 if k in rows else min(fl) for k, fl in floors.items()}
        window = self._d.seqs_from(db, [(*k, st) for k, st in starts.items()], 512)
        out: dict[tuple[str, str], list[Ack]] = {}
        writes = []
        for key, fl in floors.items():
            seqs = window.get(key, [])
            have, full = set(seqs), len(seqs) >= 512
            last = seqs[-1] if seqs else 0
            row, acks, exact = rows.get(key), [], True
            for floor in sorted(fl)[-4:]:
                if row and 0 < row[0] <= floor <= row[1]:
                    stored = True  # inside the verified run: all stored
                elif floor >= starts[key] and not (full and floor > last):
                    stored = floor in have
                else:
                    exact = False  # below the window, or beyond a full one: ask the store
                    break
                if not stored:
                    continue
                if row and 0 < row[0] <= floor <= row[1] + 1:
                    lo, end = row[0], max(row[1], floor)
                else:
                    lo, end = floor, floor
                while end + 1 in have:
                    end += 1
                if full and end >= last:
                    exact = False  # the run may go on past the window
                    break
                row = (lo, end)
                if floor <= tops[key]:
                    acks.append(Ack(key[1], floor, min(end, tops[key])))
            if not exact:
                out[key] = self._acks(db, *key, fl, tops[key])
                continue
            out[key] = acks
            if row is not None and row != rows.get(key):
                writes.append((*key, row[1], row[0]))
        if writes:
            db.executemany("INSERT INTO streams (device, stream, acked, lo) VALUES (?,?,?,?) "
                           "ON CONFLICT(device, stream) DO UPDATE SET acked = excluded.acked, "
                           "lo = excluded.lo", writes)
        return out

    def _store_one(self, db: Any, m: Inbound, now: float) -> tuple[int, int]:
        """Store one message; returns how many results were new and their logical bytes."""
        msg = m.msg
        if m.kind == "result":
            new = self._d.insert_results(db, _result_rows(m, now))
            return len(new), sum(quotas.result_bytes(r[0], r[1], r[3], r[6]) for r in new)
        if m.kind == "health":
            db.execute("INSERT INTO health (device, t, body) VALUES (?,?,?)",
                       (m.device, float(msg["t"]), body := json.dumps(msg)))
            db.execute(f"INSERT INTO health_points ({_TIMELINE_SQL}) VALUES "
                       f"(?,?{',?' * len(TIMELINE)})", _timeline_row(m.device, msg))
            return 0, quotas.health_bytes(m.device, body)
        if m.kind == "event":
            db.execute("INSERT INTO events (device, t, type, body) VALUES (?,?,?,?)",
                       (m.device, float(msg["t"]), msg["type"], body := json.dumps(msg)))
            return 0, quotas.event_bytes(m.device, msg["type"], body)
        if m.kind == "state":
            db.execute("INSERT INTO states VALUES (?,?) ON CONFLICT(device) DO UPDATE "
                       "SET body = excluded.body", (m.device, json.dumps(msg)))
            return 0, 0
        raise ValueError(f"cannot store a {m.kind!r} message")

    def _merge_views(self, db: Any, stored: Sequence[Inbound], now: float,
                     written: dict[str, tuple[float, fleet.DeviceView]] | None = None
                     ) -> None:
        """Apply the batch to the `devices` rows (locked by lock_devices) with fleet.py."""
        devices = sorted({m.device for m in stored})
        if not devices:
            return
        match, args = self._d.in_list(devices)
        rows = {d: (_view_from_json(d, body), float(updated)) for d, body, updated in db.execute(
            f"SELECT device, view, updated FROM devices WHERE device{match}", args).fetchall()}
        views = {d: v for d, (v, _) in rows.items()}
        for m in stored:
            v = views.get(m.device) or fleet.DeviceView(m.device)
            if m.kind == "state":
                v = fleet.on_state(v, m.msg, now)
            elif m.kind == "health":
                # another coordinator may already hold a newer health of this device; "newer"
                # by boottime or synced clocks, never by a clock that may read a week behind
                # (runtime/wire/clock.py made_after)
                newer = isinstance(v.health, dict) and clock.made_after(
                    float(v.health.get("t", 0) or 0), v.health.get("clk"), m.msg["t"],
                    m.msg.get("clk")) is True
                v = fleet.on_activity(v, now, None if newer else m.msg)
            else:
                v = fleet.on_activity(v, now)
            views[m.device] = v
        # A row (a few pages of JSON with the latest health) rewritten at every transaction
        # for `last_seen` alone was most of what a result cost the disk: written when
        # anything else changed, or once `last_seen` is `last_seen_write_s` behind. Only
        # other coordinators read `last_seen` from it (this one keeps the merged view), and
        # the delay is far below their stale_after_s.
        changed = [d for d in devices if _view_changed(
            rows.get(d, (None, 0.0))[0], views[d], self.last_seen_write_s)]
        self._d.update_views(db, [(_view_to_json(views[d]), now, d) for d in changed])
        if written is not None:
            written.update((d, (now if d in changed else rows[d][1], views[d]))
                           for d in devices)

    def _stored(self, db: Any, device: str, stream: str, seq: int) -> bool:
        return db.execute(f"SELECT 1 FROM {self._d.keys_table} WHERE device=? AND stream=? "
                          "AND seq=?", (device, stream, seq)).fetchone() is not None

    def _acks(self, db: Any, device: str, stream: str, floors: set[int], top: int
              ) -> list[Ack]:
        """One ack per verified floor (normally one); see the module docstring. An ack never
        goes past `top`, the highest seq just received: the device checks acks against what
        it has sent, and after a restart it has not yet re-sent what an earlier run did."""
        out = []
        for floor in sorted(floors)[-4:]:  # a device sends one floor per batch; bound forgeries
            if not self._stored(db, device, stream, floor):
                continue  # unverified: the device's lowest held result is not here (yet)
            end = self._advance(db, device, stream, floor)
            if floor <= top:
                out.append(Ack(stream, floor, min(end, top)))
        return out

    def _advance(self, db: Any, device: str, stream: str, floor: int) -> int:
        """The end of the run of stored seqs from `floor` (which is stored)."""
        row = db.execute("SELECT lo, acked FROM streams WHERE device=? AND stream=?",
                         (device, stream)).fetchone()
        if row and 0 < row[0] <= floor <= row[1] + 1:
            lo, acked = row[0], max(row[1], floor)  # a known run (all stored) covers the floor
        else:
            lo, acked = floor, floor
        while True:
            seqs = [q for (q,) in db.execute(
                f"SELECT seq FROM {self._d.keys_table} WHERE device=? AND stream=? AND seq > ? "
                "ORDER BY seq LIMIT 512", (device, stream, acked)).fetchall()]
            run = 0
            while run < len(seqs) and seqs[run] == acked + 1:
                acked, run = acked + 1, run + 1
            if run < 512:
                break
        db.execute("INSERT INTO streams (device, stream, acked, lo) VALUES (?,?,?,?) "
                   "ON CONFLICT(device, stream) DO UPDATE SET acked = excluded.acked, "
                   "lo = excluded.lo", (device, stream, acked, lo))
        return acked

    # -- quarantine -----------------------------------------------------------------------------

    def quarantine(self, rows: Sequence[tuple[str, str, str, int, float]]) -> None:
        """Record refused messages: (device or "", topic, reason, size in bytes, time).
        Detail rows are capped at QUARANTINE_PER_DEVICE per device and QUARANTINE_KEEP in
        all (newest kept); counts are kept for ever."""
        if not rows:
            return
        per_device: dict[str, int] = {}
        for device, *_ in rows:
            per_device[device[:64]] = per_device.get(device[:64], 0) + 1
        oc = self._d.order_col
        with self._d.transaction() as db:
            db.executemany(
                "INSERT INTO quarantine (device, topic, reason, size, t) VALUES (?,?,?,?,?)",
                [(d[:64], topic[:256], reason[:500], int(size), float(t))
                 for d, topic, reason, size, t in rows])
            db.executemany(
                "INSERT INTO quarantine_counts VALUES (?,?) "
                "ON CONFLICT(device) DO UPDATE SET n = quarantine_counts.n + excluded.n",
                sorted(per_device.items()))
            for device in sorted(per_device):  # each device's own newest, first
                db.execute(f"DELETE FROM quarantine WHERE device = ? AND {oc} <= (SELECT {oc} "
                           f"FROM quarantine WHERE device = ? ORDER BY {oc} DESC LIMIT 1 "
                           "OFFSET ?)", (device, device, QUARANTINE_PER_DEVICE))
            # by count, not by id distance: the trims above leave holes in the ids
            db.execute(f"DELETE FROM quarantine WHERE {oc} <= (SELECT {oc} FROM quarantine "
                       f"ORDER BY {oc} DESC LIMIT 1 OFFSET ?)", (QUARANTINE_KEEP,))

    def quarantine_counts(self) -> dict[str, int]:
        """Quarantined messages per device ("" = topic named no valid device)."""
        return dict(self._query("SELECT device, n FROM quarantine_counts"))

    def quarantined(self, device: str | None = None, limit: int = 50) -> list[dict]:
        """The newest quarantined messages (all devices, or one), newest first."""
        where, args = ("WHERE device=?", (device,)) if device is not None else ("", ())
        rows = self._query(f"SELECT t, device, topic, reason, size FROM quarantine {where} "
                           f"ORDER BY {self._d.order_col} DESC LIMIT ?", (*args, limit))
        return [{"t": t, "device": d, "topic": tp, "reason": r, "size": n}
                for t, d, tp, r, n in rows]

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """A portable write (`?` placeholders) of `rows` in one transaction: the coordinator's
        own tables (device_groups, desired, rollouts: runtime/coordinator/rollout.py)."""
        with self._d.transaction() as db:
            db.executemany(sql, rows)

    def claim(self, device: str, what: str, state: str, t: float,
              window_s: float = 60.0) -> bool:
        """Whether this coordinator is the first of those sharing the store to act on `what`
        of `device` reaching `state` (an alert transition: `alert:hot` "raised"; a birth:
        `birth` "<boot>@<t>"): each coordinator sees the same, and the webhook's receiver
        or the device must get it once. The same state again within `window_s` is another
        coordinator's duplicate; after that it is a new one (e.g. an alert's clear was
        missed while every coordinator was down)."""
        return self.claim_many([(device, what, state, t)], window_s)[0]

    def claim_many(self, items: Sequence[tuple[str, str, str, float]], window_s: float = 60.0
                   ) -> list[bool]:
        """`claim` for many (device, what, state, t) in one transaction (a refresh's alert
        transitions, a batch's births): for each, whether this coordinator is the first.
        The same rule as `claim`, row by row; the rows are taken in (device, what) order so
        two coordinators claiming overlapping sets cannot deadlock (retried if one does),
        and an item repeated in the list is decided after the one before it."""
        if not items:
            return []
        for attempt in range(3):
            try:
                with self._d.transaction() as db:
                    won: list[bool] = [False] * len(items)
                    pending = sorted(range(len(items)), key=lambda i: items[i][:2])
                    while pending:  # rounds: a key at most once per statement
                        seen: set[tuple[str, str]] = set()
                        now_, later = [], []
                        for i in pending:
                            (later if items[i][:2] in seen else now_).append(i)
                            seen.add(items[i][:2])
                        rows = [(items[i][0], items[i][1], items[i][2], float(items[i][3]))
                                for i in now_]
                        got = self._d.claim_rows(db, rows, float(window_s))
                        for i in now_:
                            won[i] = items[i][:2] in got
                        pending = later
                    return won
            except self._d.retryable:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """One write transaction for several portable statements (`?` placeholders;
        `.execute(sql, args)` returns a cursor): committed when the block ends, rolled back
        when it raises (the bundle shelf deletes a bundle's row and its chunk rows in one)."""
        with self._d.transaction() as db:
            yield db

    def update(self, sql: str, args: Sequence[Any]) -> int:
        """A portable single statement in one transaction; returns the rows it changed
        (rollout.py's compare-and-swap of a rollout)."""
        with self._d.transaction() as db:
            return db.execute(sql, tuple(args)).rowcount

    def read(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        """A portable query's rows."""
        return self._query(sql, args)

    def read_in(self, sql: str, keys: Sequence[str]) -> list[tuple]:
        """A portable query ending in a text column, matched against any of `keys` (one array
        parameter on PostgreSQL, a parameter each on SQLite: keep `keys` to a few hundred)."""
        match, args = self._d.in_list(keys)
        return self._query(sql + match, args)

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        with self._d.reader() as db:
            return [tuple(r) for r in db.execute(sql, tuple(args)).fetchall()]

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
        """Stored results per device (the maintained `result_counts`, not a GROUP BY)."""
        return dict(self._query("SELECT device, n FROM result_counts WHERE n > 0"))

    def total_results(self) -> int:
        """Stored results over all devices (from `result_counts`)."""
        (n,), = self._query("SELECT COALESCE(SUM(n), 0) FROM result_counts")
        return int(n)

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

    def views(self, since: float | None = None) -> dict[str, fleet.DeviceView]:
        """The fleet view every coordinator sharing this store maintains (`devices`), before
        ageing and alerts (fleet.refresh); with `since`, only rows updated after it (by the
        writing coordinator's clock). A row that does not decode is left out."""
        out = {}
        where, args = ("WHERE updated > ?", (since,)) if since is not None else ("", ())
        for d, body in self._query(f"SELECT device, view FROM devices {where}", args):
            v = _view_from_json(d, body)
            if v is not None:
                out[d] = v
        return out

    def changed_views(self, since: float | None, seen: dict[str, float]
                      ) -> dict[str, fleet.DeviceView]:
        """`views(since)` without the rows whose `updated` stamp is the one in `seen` (already
        read, or written by this process: Store.ingest's `written`), so a refresh decodes
        each row once per change, not on every read of its window; `seen` is updated."""
        out = {}
        where, args = ("WHERE updated > ?", (since,)) if since is not None else ("", ())
        for d, updated, body in self._query(
                f"SELECT device, updated, view FROM devices {where}", args):
            if seen.get(d) == updated:
                continue
            v = _view_from_json(d, body)
            if v is not None:
                out[d] = v
                seen[d] = updated
        return out

    def latest_health(self) -> dict[str, dict]:
        """The newest health of every device."""
        rows = self._query("SELECT h.device, h.body FROM health h JOIN (SELECT device, "
                           "MAX(t) AS t FROM health GROUP BY device) m "
                           "ON m.device = h.device AND m.t = h.t")
        return {d: json.loads(b) for d, b in rows}

    def health_history(self, device: str, since: float, until: float, limit: int
                       ) -> list[dict]:
        """A device's health in [since, until], oldest first, as the reduced records
        `edgerun report` plots (runtime/wire/health_history.record); more than `limit` are thinned
        to `limit` evenly spread ones (a day at 5 s is 17 280)."""
        from runtime.wire.health_history import record

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
        # the bucket number truncated (t >= since): PostgreSQL's CAST rounds, so FLOOR there
        bucket = ("CAST((t - ?) / ? AS INTEGER)" if self.backend == "sqlite"
                  else "FLOOR((t - ?) / ?)")
        return self._query(
            f"SELECT MAX(t), {cols} FROM health_points WHERE device=? AND t >= ? AND t <= ? "
            f"GROUP BY {bucket} ORDER BY 1",
            (device, since, until, since, width))

    def prune(self, keep_health_s: float, keep_events_s: float, now: float | None = None
              ) -> None:
        """Drop health and events older than their retention (results are never pruned here).
        On PostgreSQL whole day partitions of health go first; rows left are deleted. `now`:
        the time ages are judged at (the retention's steady wall clock; default the wall)."""
        now = time.time() if now is None else now
        self._unuse(self._d.drop_partitions("health", now - keep_health_s, acked_only=False),
                    results=False)
        with self._d.transaction() as db:
            gone: Counter = Counter()
            for pool, keep in (("health", keep_health_s), ("events", keep_events_s)):
                for d, n in db.execute(f"DELETE FROM {pool} WHERE t < ? RETURNING device, "
                                       f"{quotas.POOL_BYTES_SQL[pool]}",
                                       (now - keep,)).fetchall():
                    gone[d, pool] += int(n)
            db.execute("DELETE FROM health_points WHERE t < ?", (now - keep_health_s,))
            _uncharge(db, gone)

    def used_bytes(self) -> int:
        """Bytes of the database in use (SQLite: pages minus free pages; PostgreSQL: this
        schema's tables with indexes and TOAST)."""
        return self._d.used_bytes()

    def usage(self) -> dict[str, int]:
        """The logical bytes each device holds (quotas.py; devices holding nothing left out)."""
        return {d: int(b) for d, b in self._query(
            "SELECT device, SUM(bytes) FROM pool_usage GROUP BY device HAVING SUM(bytes) > 0")}

    def pools(self) -> dict[tuple[str, str], int]:
        """The logical bytes of each (device, pool) holding any (quotas.POOLS)."""
        return {(d, p): int(b) for d, p, b in self._query(
            "SELECT device, pool, bytes FROM pool_usage WHERE bytes > 0")}

    def size_bytes(self) -> int:
        """The store's size as held against max_store_mb: SQLite, the file's pages in use;
        PostgreSQL, the devices' logical bytes times the overhead measured while the files
        grew, plus the bundle shelf (row deletes there leave space for reuse, never a smaller
        file, so pg_total_relation_size stays at its high-water mark: see set_cap)."""
        if self.backend == "sqlite":
            return self.used_bytes()
        return int(sum(self.usage().values()) * self._ratio) + self._reserved

    @property
    def budget_bytes(self) -> int:
        """The devices' logical budget (set_cap; 0 = no cap)."""
        return self._budget

    @property
    def overhead(self) -> float:
        """The store's bytes per logical byte as last measured (quotas.overhead)."""
        return self._ratio

    def take_shed(self) -> Counter:
        """The rows admission shed since the last call, per (device, pool); reset."""
        with self._shed_lock:
            out, self.shed = self.shed, Counter()
        return out

    def set_cap(self, max_bytes: int, reserved: int = 0) -> int:
        """Share `max_bytes` (0 = no cap) among the devices from now on (ingest refuses what
        a device over its share sends while the store is full): `reserved` of the store's
        bytes are not the devices' (the bundle shelf). The store's overhead per logical byte
        is measured here (quotas.overhead). Returns the devices' logical budget."""
        self._cap, self._reserved = max(0, max_bytes), reserved
        if max_bytes <= 0:
            self._budget = 0
            return 0
        return self._measure(sum(self.usage().values()))

    def _measure(self, logical: int) -> int:
        """The overhead measured with the devices holding `logical` bytes, and the budget
        from it (set_cap; after each batch on SQLite, and on PostgreSQL until measured)."""
        cap, reserved = max(0, self._cap - self._reserved), self._reserved
        ratio = quotas.overhead(self.used_bytes() - reserved, logical, cap, self._ratio)
        if self.backend != "sqlite" and self._measured:
            # PostgreSQL's files keep their high-water mark: after deletes the same bytes
            # hold fewer live rows, and measuring them again would raise the ratio until the
            # budget collapsed (every device "over its share"). The lowest ratio measured is
            # the one of rows packed as inserted; later inserts reuse the freed space.
            ratio = min(ratio, self._ratio)
        self._measured = self._measured or logical >= cap * quotas.MEASURE_MIN_FRACTION
        self._ratio = ratio
        self._budget = quotas.budget(cap, self._ratio)
        return self._budget

    def maintain(self) -> None:
        """Create the time partitions ahead (PostgreSQL; run at least daily)."""
        self._d.maintain()

    def prune_results(self, max_age_s: float = 0.0, max_bytes: int = 0, chunk: int = 2000,
                      now: float | None = None, reserved: int = 0) -> dict[str, int]:
        """Retention: delete results received more than `max_age_s` ago, then, while the
        store uses more than `max_bytes`, first what devices over their fair share hold
        (quotas.py; `self.reclaimed` says from whom), then the oldest results, health and
        events. 0 = off. `reserved`: bytes of the store that are not the devices' (the
        bundle shelf), left out of the shares.

        Only results at or below their stream's ack are deleted for age or for the oldest:
        the ack is kept in `streams`, apart from the rows, so pruning cannot lower it, and
        rows above it are still needed to close gaps (deleting them would stall the ack and
        make the device re-send). The one exception is a device over its share when other
        devices hold data: once its acked rows, health and events are gone its newest
        unacked rows go too (it still holds them and re-sends them; the alternative is
        deleting another device's acked data for it). Works in chunks, each its own short
        transaction, so ingest is never held off for long. On PostgreSQL whole day
        partitions are dropped when every row in them is acked (the rest is deleted by row),
        and the size cap drops only whole partitions past the shares (row deletes there free
        space for reuse but do not shrink the files). Returns counts of what it deleted."""
        now = time.time() if now is None else now
        out = {"results_by_age": 0, "results_by_size": 0, "health_by_size": 0,
               "events_by_size": 0}
        self.reclaimed = {}
        eligible = ("SELECT r.device, r.stream, r.seq FROM results r JOIN streams s "
                    "ON s.device = r.device AND s.stream = r.stream WHERE r.seq <= s.acked")
        if max_age_s > 0:
            self._maintain_quietly()
            dropped = self._d.drop_partitions("results", now - max_age_s, acked_only=True)
            self._unuse(dropped, results=True)
            out["results_by_age"] += sum(n for n, _ in dropped.values())
            while n := self._delete_results(f"{eligible} AND r.received < ? LIMIT ?",
                                            (now - max_age_s, chunk)):
                out["results_by_age"] += n
        if max_bytes > 0:
            self.set_cap(max_bytes, reserved)
            self._reclaim(max_bytes, chunk, out)
            if self.backend == "sqlite" and self._over_cap(max_bytes):
                # still over with no device over its share: the overhead per logical byte
                # was measured on another mix of rows; measured again, the budget shrinks
                # and the devices holding most are over their share again. Nothing of a
                # device within its share is deleted, ever (otherwise the oldest health of
                # every device went, a day's partition of it on PostgreSQL). (PostgreSQL's
                # cap is the logical budget: its files do not shrink by row deletes.)
                self._ratio = max(self._ratio, min(quotas.MAX_OVERHEAD, (
                    self.used_bytes() - reserved) / max(1, sum(self.usage().values()))))
                self._budget = quotas.budget(max(0, max_bytes - reserved), self._ratio)
                self._reclaim(max_bytes, chunk, out)
        if any(out.values()) or self.shed:  # (admission's deletes count too)
            self._d.after_prune()
        return out

    def _over_cap(self, max_bytes: int) -> bool:
        """Whether the store is over its cap: its file (SQLite), or the devices' logical
        bytes over their budget (PostgreSQL: row deletes do not shrink its files)."""
        if self.backend == "sqlite":
            return self.used_bytes() > max_bytes
        return sum(self.usage().values()) > self._budget

    def _reclaim(self, max_bytes: int, chunk: int, out: dict[str, int]) -> None:
        """While the store is over its cap, delete from the pool (device and kind of row) most
        over its quota: its oldest acked results, oldest health or oldest events, and for
        results, when other devices hold data and nothing acked is left, its newest unacked
        ones. A pool within its quota is never taken from."""
        skip: set[tuple[str, str]] = set()  # pools over quota with nothing that may go
        for _ in range(10_000):
            if not self._over_cap(max_bytes):
                return
            pools = self.pools()
            over = [o for o in quotas.over_share(pools, self._budget) if o[:2] not in skip]
            if not over:
                return
            device, pool, excess = over[0]
            others = any(b > 0 for (d, _), b in pools.items() if d != device)
            held = self.usage().get(device, 0)
            mine = self.reclaimed.setdefault(device, {"results": 0, "unacked": 0, "health": 0,
                                                      "events": 0, "before": held,
                                                      "after": held})
            with self._d.transaction() as db:
                rows = min(chunk, max(1, excess // max(1, self._pool_row_bytes(
                    db, device, pool)) + 1))
                if pool != "results":
                    n = len(self._delete_oldest(db, pool, device, rows))
                    key = pool
                elif n := len(self._delete_in(db, _ACKED_OLDEST, (device, rows))):
                    key = "results"
                else:
                    n, key = 0, "unacked"
            if not n and key == "unacked" and others:
                n = self._delete_results(
                    "SELECT r.device, r.stream, r.seq FROM results r LEFT JOIN streams s ON "
                    "s.device = r.device AND s.stream = r.stream WHERE r.device = ? AND "
                    "(s.acked IS NULL OR r.seq > s.acked) ORDER BY r.received DESC, r.seq DESC "
                    "LIMIT ?", (device, rows), lock=device)
            if not n:
                skip.add((device, pool))  # its unacked rows, alone in the store
                continue
            mine[key] += n
            out[f"{'results' if key == 'unacked' else key}_by_size"] += n
            mine["after"] = self.usage().get(device, 0)

    def quarantine_stalled(self, wait_s: float, now: float | None = None) -> list[Stalled]:
        """Streams whose ack has not moved for `wait_s` since a batch's floor was first not
        stored (the floor is never sent, or never stored): their rows above the ack are
        deleted and an event `stream_quarantined` is stored for the device. Nothing a
        device still needs is lost: it deletes only what an ack covers, so it still holds
        these and re-sends them; a stream that moved meanwhile is only forgotten."""
        now = time.time() if now is None else now
        out = []
        for device, stream, since, then in self._query(
                "SELECT device, stream, since, acked FROM stalls WHERE since < ? "
                "ORDER BY device, stream", (now - wait_s,)):
            with self._d.transaction() as db:
                self._d.lock_devices(db, [device])  # ingest of this device waits
                row = db.execute("SELECT acked FROM streams WHERE device=? AND stream=?",
                                 (device, stream)).fetchone()
                acked = int(row[0]) if row else 0
                db.execute("DELETE FROM stalls WHERE device=? AND stream=?", (device, stream))
                if acked > then:
                    continue  # it moved: not stalled (a new stall is noted by ingest)
                gone = self._delete_in(db, "SELECT device, stream, seq FROM results WHERE "
                                       "device = ? AND stream = ? AND seq > ?",
                                       (device, stream, acked))
                if not gone:
                    continue
                rows, size = len(gone), sum(b for *_, b in gone)
                body = json.dumps({"v": 1, "type": "stream_quarantined", "t": now,
                                   "stream": stream, "acked": acked, "rows": rows,
                                   "bytes": size, "since": since,
                                   "reason": f"no ack for {now - since:.0f} s (floor_wait_s "
                                             f"{wait_s:g}): its floor was never stored"})
                db.execute("INSERT INTO events (device, t, type, body) VALUES (?,?,?,?)",
                           (device, now, "stream_quarantined", body))
                _charge(db, Counter({(device, "events"): quotas.event_bytes(
                    device, "stream_quarantined", body)}))
                out.append(Stalled(device, stream, acked, rows, size, since))
        if out:
            self._d.after_prune()
        return out

    def _maintain_quietly(self) -> None:
        with contextlib.suppress(self._d.errors):  # tomorrow's partition can wait a pass
            self._d.maintain()

    def _delete_results(self, which: str, args: tuple, lock: str | None = None) -> int:
        """Delete the results `which` selects (device, stream, seq), their keys (PostgreSQL),
        counts and usage, in one transaction (with `lock`'s device row locked first: rows
        above an ack are deleted only where no ingest of that device runs); how many."""
        with self._d.transaction() as db:
            if lock is not None:
                self._d.lock_devices(db, [lock])
            return len(self._delete_in(db, which, args))

    def _delete_in(self, db: Any, which: str, args: tuple) -> list[tuple]:
        """_delete_results inside a transaction; the (device, stream, seq, bytes) deleted."""
        gone = [tuple(r) for r in db.execute(
            "DELETE FROM results WHERE (device, stream, seq) IN "
            f"({which}) RETURNING device, stream, seq, {quotas.RESULT_BYTES_SQL}",
            args).fetchall()]
        if gone and self._d.keys_table != "results":
            db.executemany("DELETE FROM result_keys WHERE device=? AND stream=? AND seq=?",
                           [r[:3] for r in gone])
        per = Counter(r[0] for r in gone)
        db.executemany("UPDATE result_counts SET n = n - ? WHERE device = ?",
                       [(n, d) for d, n in sorted(per.items())])
        size: Counter = Counter()
        for r in gone:
            size[r[0], "results"] += int(r[3])
        _uncharge(db, size)
        return gone

    def _delete_rows(self, table: str, where: str, args: tuple) -> int:
        """Delete rows of health or events matching `where`, and their usage; how many."""
        size_sql = quotas.HEALTH_BYTES_SQL if table == "health" else quotas.EVENT_BYTES_SQL
        with self._d.transaction() as db:
            gone = db.execute(f"DELETE FROM {table} WHERE {where} RETURNING device, "
                              f"{size_sql}", args).fetchall()
            size: Counter = Counter()
            for d, n in gone:
                size[d, table] += int(n)
            _uncharge(db, size)
        return len(gone)

    def _unuse(self, per_device: dict[str, tuple[int, int]], results: bool) -> None:
        """Take dropped partitions' (rows, bytes) per device off the counts and usage."""
        if per_device:
            with self._d.transaction() as db:
                if results:
                    db.executemany("UPDATE result_counts SET n = n - ? WHERE device = ?",
                                   [(n, d) for d, (n, _) in sorted(per_device.items()) if d])
                pool = "results" if results else "health"
                _uncharge(db, Counter({(d, pool): b for d, (_, b) in per_device.items() if d}))

    def _delete(self, sql: str, args: tuple) -> int:
        with self._d.transaction() as db:
            return db.execute(sql, args).rowcount

    @property
    def order_col(self) -> str:
        """The column giving health, events and quarantine rows their order and identity
        (rowid on SQLite, id on PostgreSQL), for portable statements naming one row."""
        return self._d.order_col

    def close(self) -> None:
        """Close the database (or the connection pool)."""
        self._d.close()


def _charge(db: Any, size: Counter) -> None:
    """Add logical bytes stored to each (device, pool) of `size`."""
    if rows := sorted((d, p, int(n)) for (d, p), n in size.items() if n):
        db.executemany("INSERT INTO pool_usage VALUES (?,?,?) ON CONFLICT(device, pool) "
                       "DO UPDATE SET bytes = pool_usage.bytes + excluded.bytes", rows)


def _uncharge(db: Any, size: Counter) -> None:
    """Take logical bytes deleted off each (device, pool) of `size`."""
    if size:
        db.executemany("UPDATE pool_usage SET bytes = bytes - ? WHERE device = ? AND pool = ?",
                       [(int(n), d, p) for (d, p), n in sorted(size.items()) if n])


def _result_rows(m: Inbound, now: float) -> list[tuple]:
    """The `results` rows of one result message (raises on a seq out of range)."""
    rows = []
    for r in m.msg["results"]:
        seq = r["seq"]
        if not (isinstance(seq, int) and 0 < seq < SEQ_LIMIT):
            raise ValueError(f"seq {seq!r} outside [1, 2^62)")
        # The boot that produced the result (carried per result), not the re-sender's.
        rows.append((m.device, m.msg["stream"], seq, r.get("boot") or m.msg["boot"],
                     float(r["t"]), now, json.dumps(r, separators=(",", ":"))))
    return rows


_VIEW_FIELDS = tuple(f for f in fleet.DeviceView.__dataclass_fields__
                     if f not in ("status", "alerts"))


def _view_changed(old: fleet.DeviceView | None, new: fleet.DeviceView, every_s: float
                  ) -> bool:
    """Whether `new` must be written over the stored `old`: it differs in more than
    `last_seen`, or its `last_seen` moved at least `every_s` (0: any move)."""
    if old is None:
        return True
    if new.last_seen - old.last_seen >= every_s and new.last_seen != old.last_seen:
        return True
    return {**new.__dict__, "last_seen": 0} != {**old.__dict__, "last_seen": 0}


def _view_to_json(v: fleet.DeviceView) -> str:
    # a shallow dict (dataclasses.asdict deep-copies: it was most of ingest's time)
    return json.dumps({f: getattr(v, f) for f in _VIEW_FIELDS}, separators=(",", ":"))


def _view_from_json(device: str, body: str) -> fleet.DeviceView | None:
    """A stored view back to a DeviceView; None (start afresh) when the row is not one."""
    try:
        d = json.loads(body)
        if not isinstance(d, dict) or not d:
            return None
        fields = {k: d[k] for k in _VIEW_FIELDS if k in d and k != "device"}
        # the status from the fields (as `replace` after construction did, at half the cost:
        # every refresh decodes the rows other coordinators wrote)
        return fleet.DeviceView(device, status="online" if fields.get("online") else
                                "asleep" if fields.get("asleep") else "offline", **fields)
    except (ValueError, TypeError):
        return None


def _timeline_row(device: str, msg: dict) -> tuple:
    """The health_points row of one health message."""
    return (device, float(msg["t"]), *(_number(msg, path) for _, path in TIMELINE))


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
