"""The coordinator store's ingest: results exactly once, their acks, health, events, states
and the fleet view each batch moves, in one transaction per batch.

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

Before anything of a batch is written, the fair shares (budget.py) admit it; a stream whose
ack does not move is noted in `stalls` for retention (pruning.py). The batch's devices'
`devices` rows (the merged view, fleet.py) and `result_counts` are updated in the same
transaction, so every coordinator sharing the store answers the same.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from runtime.coordinator import fleet, quotas
from runtime.coordinator.budget import Budget
from runtime.coordinator.store_rows import (
    TIMELINE,
    Ack,
    Dialect,
    Inbound,
    charge,
    marker_row,
    view_from_json,
    view_to_json,
)
from runtime.wire import clock

_TIMELINE_SQL = ", ".join(("device", "t", *(name for name, _ in TIMELINE)))
# A device's streams (one per outbox it ever had: a new one after a reinstall or a damaged
# outbox): rows never deleted and outside its fair share, so bounded here. Past this a
# result on a new stream is refused (quarantined, naming the device). A memory-only
# outbox's streams (MEMORY_STREAM_PREFIX) are not counted: see stream_refused.
MAX_STREAMS_PER_DEVICE = 256
# The stream id of a device's memory-only outbox begins so (runtime/telemetry/outbox.py,
# the same string): one a kernel boot, dead once the boot is over
MEMORY_STREAM_PREFIX = "mem-"
# `last_seen` alone moving rewrites a device's `devices` row at most this often (seconds)
LAST_SEEN_WRITE_S = 5.0
SEQ_LIMIT = 1 << 62


def memory_stream(stream: str) -> bool:
    """Whether `stream` is a memory-only outbox's (its id says so; only its own device can
    claim it, and only for its own results)."""
    return stream.startswith(MEMORY_STREAM_PREFIX)


def stream_refused(known: Collection[str], stream: str,
                   cap: int = MAX_STREAMS_PER_DEVICE) -> bool:
    """Whether a result on `stream` is refused by its device's stream cap, `known` being the
    device's streams the store holds (acked, or stalled waiting for a floor).

    A known stream never is. A memory-only outbox's stream never counts nor is refused:
    its outbox is RAM, gone with its kernel boot (a restart in the same boot carries the
    same stream on), so every older one can never send again, and its row is deleted once
    its results are (Pruning.forget_memory_streams): a memory stream's row stands beside
    results the device's fair share holds, never alone. A disk stream cannot be told from
    one whose ack was lost, so none is forgotten: a new one is refused once the device has
    `cap` disk streams."""
    if stream in known or memory_stream(stream):
        return False
    return sum(1 for s in known if not memory_stream(s)) >= cap


class _Redo(Exception):
    """The fast path (no savepoints) hit a message the store refuses: redo with savepoints."""


class Ingest:
    """Stores batches of inbound messages through the store's dialect, admitted by `budget`
    (see module docstring)."""

    def __init__(self, d: Dialect, budget: Budget):
        self._d, self._budget = d, budget
        # a device's `devices` row is not rewritten for a `last_seen` that moved less than
        # this (the coordinator sets it from stale_after_s)
        self.last_seen_write_s = LAST_SEEN_WRITE_S
        self.refused_over_share: Counter = Counter()  # messages refused, per device
        # streams known to exist, per device (bounded by MAX_STREAMS_PER_DEVICE each): a
        # result on one of these needs no query to check the cap
        self._streams_seen: dict[str, set[str]] = {}
        self._new_markers: set[tuple[str, str, int]] = set()  # refusal markers inserted
        self._marked: list[tuple[int, int, str, int]] = []  # the last batch's (ingest)

    def ingest(self, messages: Sequence[Inbound],
               written: dict[str, tuple[float, fleet.DeviceView]] | None = None,
               refused_items: list[tuple[int, int, str, int]] | None = None,
               now: float | None = None
               ) -> tuple[dict[tuple[str, str], list[Ack]], list[tuple[int, str]]]:
        """Store one batch in one transaction; a message the store refuses costs only itself.

        The batch is first tried without savepoints (one round trip less per message on a
        server); if any message is refused it is redone with one savepoint per message.
        Returns the acks per (device, stream) touched by results, and (index, reason) of each
        message refused (the caller quarantines those; the rest of the batch stands): by the
        store, or by the fair shares (a device over its share of a full store).
        `written`, when given, receives each stored device's merged view as written to
        `devices` and its `updated` stamp (the coordinator then needs not read it back).
        `refused_items`, when given, receives (index, seq, reason, bytes) of each refused
        item of a result message (Inbound.refused) marked now: one marked before (a re-sent
        message) is not told again, so the caller quarantines each refused seq once. `now`:
        the wall time it was received at (default: read here; the coordinator gives the one
        its fleet view stamps, so a clock step in between cannot set the two apart)."""
        if not messages:
            return {}, []
        for savepoints in (False, True):
            for attempt in range(3):
                try:
                    if written is not None:
                        written.clear()  # a retried attempt writes again
                    out = self._ingest(messages, savepoints, written,
                                       time.time() if now is None else now)
                    if refused_items is not None:
                        refused_items[:] = self._marked
                    return out
                except _Redo:
                    break
                except self._d.retryable:
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def _ingest(self, messages: Sequence[Inbound], savepoints: bool,
                written: dict[str, tuple[float, fleet.DeviceView]] | None, now: float
                ) -> tuple[dict[tuple[str, str], list[Ack]], list[tuple[int, str]]]:
        floors: dict[tuple[str, str], set[int]] = {}
        tops: dict[tuple[str, str], int] = {}  # highest seq received per stream in this batch
        refused: list[tuple[int, str]] = []
        new_per_device: Counter = Counter()
        bytes_per_device: Counter = Counter()
        stored: list[Inbound] = []
        stored_idx: list[int] = []  # each stored message's index in `messages`
        self._new_markers = set()
        with self._d.transaction() as db:
            # Serialises this batch's devices against other coordinators (PostgreSQL) so
            # their acks and views see every committed result.
            self._d.lock_devices(db, [m.device for m in messages])
            admitted, refused = self._budget.admit(db, messages)
            over_share = list(refused)
            admitted = self._cap_streams(db, messages, admitted, refused)
            if not savepoints:
                try:
                    new_per_device, bytes_per_device = self._store_all(
                        db, [messages[i] for i in admitted], now)
                except (*self._d.errors, ValueError, TypeError, KeyError, OverflowError) as e:
                    raise _Redo from e
                stored, stored_idx = [messages[i] for i in admitted], list(admitted)
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
                    stored_idx.append(i)
                db.execute("RELEASE SAVEPOINT msg")
            self._marked = self._note_refused(db, list(zip(stored_idx, stored, strict=True)),
                                              now, bytes_per_device)
            charge(db, bytes_per_device)
            for m in stored:
                if m.kind == "result":
                    key = (m.device, m.msg["stream"])
                    floors.setdefault(key, set()).add(m.msg["floor"])
                    # a refused item's seq was received too: the ack may cover it
                    tops[key] = max([tops.get(key, 0), *(r["seq"] for r in m.msg["results"]),
                                     *(q for q, _, _ in m.refused)])
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
        self._budget.committed()
        return {k: v for k, v in acks.items() if v}, sorted(refused)

    def _note_refused(self, db: Any, stored: Sequence[tuple[int, Inbound]], now: float,
                      size: Counter) -> list[tuple[int, int, str, int]]:
        """(index, seq, reason, bytes) of each refused item marked by this batch (a marker
        already stored is not: the message was re-sent), and one `results_refused` event per
        stream that had any, saying how many and the first reason (charged to `size`)."""
        out: list[tuple[int, int, str, int]] = []
        per_stream: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for i, m in stored:
            for seq, why, nbytes in m.refused:
                key = (m.device, m.msg["stream"], seq)
                if key in self._new_markers:
                    self._new_markers.discard(key)  # the same seq twice: told once
                    out.append((i, seq, why, nbytes))
                    per_stream.setdefault(key[:2], []).append((seq, why))
        for (device, stream), items in sorted(per_stream.items()):
            seqs = sorted(q for q, _ in items)
            body = json.dumps({"v": 1, "type": "results_refused", "t": now, "stream": stream,
                               "n": len(items), "seqs": seqs[:20], "reason": items[0][1][:300]})
            db.execute("INSERT INTO events (device, t, type, body) VALUES (?,?,?,?)",
                       (device, now, "results_refused", body))
            size[device, "events"] += quotas.event_bytes(device, "results_refused", body)
        return out

    def _cap_streams(self, db: Any, messages: Sequence[Inbound], admitted: list[int],
                     refused: list[tuple[int, str]]) -> list[int]:
        """`admitted` less the results on a new stream that stream_refused refuses
        (appended to `refused` with the reason). Memory streams are neither looked up nor
        remembered: they are never refused, and a device has one a boot."""
        seen = self._streams_seen
        devices = sorted({m.device for i in admitted if (m := messages[i]).kind == "result"
                          and not memory_stream(st := m.msg["stream"])
                          and st not in seen.get(m.device, ())})
        if not devices:  # the usual batch: every stream known already
            return admitted
        match, args = self._d.in_list(devices)
        have: dict[str, set[str]] = {d: set() for d in devices}
        for d, st in db.execute(  # acked streams, and those still waiting for their floor
                f"SELECT device, stream FROM streams WHERE device{match} UNION "
                f"SELECT device, stream FROM stalls WHERE device{match}", args + args).fetchall():
            if not memory_stream(st):
                have[d].add(st)
        seen.update(have)
        keep = []
        for i in admitted:
            m = messages[i]
            known = have.get(m.device) if m.kind == "result" else None
            if known is not None:
                st = m.msg["stream"]
                if stream_refused(known, st):
                    refused.append((i, f"device {m.device}: has {len(known)} streams, the "
                                       "most a device may; a result on a new one is refused"))
                    continue
                if not memory_stream(st):
                    known.add(st)
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
                results.extend(result_rows(m, now))
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
        self._new_markers.update((r[0], r[1], r[2]) for r in new if not r[3])
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
            new = self._d.insert_results(db, result_rows(m, now))
            self._new_markers.update((r[0], r[1], r[2]) for r in new if not r[3])
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
        rows = {d: (view_from_json(d, body), float(updated)) for d, body, updated in db.execute(
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
        changed = [d for d in devices if view_changed(
            rows.get(d, (None, 0.0))[0], views[d], self.last_seen_write_s)]
        self._d.update_views(db, [(view_to_json(views[d]), now, d) for d in changed])
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


def result_rows(m: Inbound, now: float) -> list[tuple]:
    """The `results` rows of one result message (raises on a seq out of range): its valid
    items, then a refusal marker for each refused item (`marker_row`)."""
    rows = []
    for r in m.msg["results"]:
        seq = r["seq"]
        if not (isinstance(seq, int) and 0 < seq < SEQ_LIMIT):
            raise ValueError(f"seq {seq!r} outside [1, 2^62)")
        # The boot that produced the result (carried per result), not the re-sender's.
        rows.append((m.device, m.msg["stream"], seq, r.get("boot") or m.msg["boot"],
                     float(r["t"]), now, json.dumps(r, separators=(",", ":"))))
    # after the valid ones: a seq both valid and refused in one message is stored valid
    rows += [marker_row(m.device, m.msg["stream"], seq, why, now) for seq, why, _ in m.refused]
    return rows


def view_changed(old: fleet.DeviceView | None, new: fleet.DeviceView, every_s: float
                  ) -> bool:
    """Whether `new` must be written over the stored `old`: it differs in more than
    `last_seen`, or its `last_seen` moved at least `every_s` (0: any move)."""
    if old is None:
        return True
    if new.last_seen - old.last_seen >= every_s and new.last_seen != old.last_seen:
        return True
    return {**new.__dict__, "last_seen": 0} != {**old.__dict__, "last_seen": 0}


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
