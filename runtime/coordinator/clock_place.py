"""Placing the messages a device made while its clock was not synced (docs/clocks.md).

A device stamps each result, health and event with `clk` (runtime/wire/clock.py): synced or
not, the kernel's boot id (`kb`) and CLOCK_BOOTTIME (`bt`). Within one kernel boot, wall minus
boottime is one number once the clock is synced, so any synced message of that boot gives it
(`offset`), and an unsynced message of the same boot belongs at `bt + offset`.

Placed here, at the coordinator, not on the device: the device's outbox would have to rewrite
rows it has already written (more writes on an SD card) and could not reach what it sent
already; the coordinator sees every message of the boot, sent before the sync or after, and
keeps both times: the placed one is the message's `t` (and the row's, so every query, the
dashboard and `edgerun report` use it), the device's claim stays in `clk.claimed`.

A result whose boot has no offset yet is stored with its claim, and its process boot (the
results table's `boot`, which lies inside one kernel boot) is noted once in `clock_pending`
(one row a process start, not one a result: a box that never syncs must not double the
coordinator's writes); when a synced message of that kernel boot arrives, `settle` rewrites
the unplaced results of those process boots, time and body (the pool's byte count moved by
the body's growth).
Health and events the same way: a kernel boot with some stored unplaced is noted once
(`clock_pending` row with boot "*<kb>"), and `settle` rewrites that device's health and event
rows of the boot (the dashboard's timeline rows in `health_points` moved with them), so
`edgerun report`, which plots health, places them too.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from runtime.coordinator.quotas import event_bytes, health_bytes, result_bytes
from runtime.coordinator.store import Inbound, Store
from runtime.coordinator.store_rows import PENDING_DDL, PENDING_WIDEN_S
from runtime.wire import clock

log = logging.getLogger("edgerun.coordinator")

_DDL = (
    "CREATE TABLE IF NOT EXISTS clock_offsets (device TEXT NOT NULL, kb TEXT NOT NULL, "
    "off DOUBLE PRECISION NOT NULL, t DOUBLE PRECISION NOT NULL, PRIMARY KEY (device, kb))",
    PENDING_DDL,
)
_ADDED = (("stream", "TEXT"), ("lo", "DOUBLE PRECISION"), ("hi", "DOUBLE PRECISION"),
          ("seen", "DOUBLE PRECISION"))  # columns a store made by an older version lacks
MOVED_S = 0.5  # an offset is written again when it moved more than this
CHUNK = 500  # rows rewritten per transaction when a boot's offset arrives
BUDGET = 2000  # rows read per settle() call: ingest waits at most this long, the rest later
WIDEN_S = PENDING_WIDEN_S  # a pending boot's last claimed t written again this much later
# Distinct kernel boots (offsets) and process boots (pending) kept per device: a device
# sending a new `kb` or `boot` with every message must not grow the store without bound.
# Hourly reboots for the week of retention are 168.
MAX_BOOTS = 256
RELOAD_S = 60.0  # offsets and pending boots re-read from the store (another coordinator's)
PRUNE_S = 3600.0
OTHERS = "*"  # a clock_pending boot "*<kb>": health and events of kernel boot kb (ids never
# hold "*": payloads' _ID pattern)


def learn(inbound: Sequence[Inbound]) -> dict[tuple[str, str], tuple[float, float]]:
    """(device, kb) -> (offset, t) from the synced stamps of a batch, the latest t winning
    (pure). Results carry their stamp per result, the others on the message."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for m in inbound:
        for item in _items(m):
            c = item.get("clk")
            t = item.get("t")
            if not isinstance(t, int | float) or (off := clock.offset_of(t, c)) is None:
                continue
            key = (m.device, c["kb"])
            if key not in out or t >= out[key][1]:
                out[key] = (off, float(t))
    return out


def place(inbound: Sequence[Inbound], offsets: dict[tuple[str, str], tuple[float, float]]
          ) -> dict[tuple[str, str, str], list]:
    """Move the `t` of every unsynced item with a known offset to where it belongs (its claim
    into `clk.claimed`), in place; returns the (device, process boot, kernel boot) of the
    messages that could not be placed yet, each with where they are: [stream, lo, hi] (a
    result's stream and lowest seq; health and events' lowest and highest claimed t)."""
    waiting: dict[tuple[str, str, str], list] = {}
    for m in inbound:
        for item in _items(m):
            c = item.get("clk")
            if not isinstance(c, dict) or c.get("sync") is not False or "claimed" in c:
                continue
            known = offsets.get((m.device, c["kb"]))
            at = clock.placed(item["t"], c, known[0] if known else None)
            if at is not None and clock.FLOOR_T <= at <= clock.CEILING_T:
                item["clk"] = {**c, "claimed": item["t"]}
                item["t"] = at
            elif m.kind == "result":
                key = (m.device, item.get("boot") or m.msg["boot"], c["kb"])
                seq = float(item.get("seq", 0))
                w = waiting.setdefault(key, [m.msg["stream"], seq, None])
                w[1] = min(w[1], seq) if w[0] == m.msg["stream"] else w[1]
            elif m.kind in ("health", "event"):  # "*": the kernel boot's health and events
                w = waiting.setdefault((m.device, OTHERS + c["kb"], c["kb"]),
                                       [None, float(item["t"]), float(item["t"])])
                w[1], w[2] = min(w[1], item["t"]), max(w[2], item["t"])
    return waiting


def _items(m: Inbound) -> list[dict[str, Any]]:
    if m.kind == "result":
        return [r for r in m.msg.get("results", ()) if isinstance(r, dict)]
    return [m.msg] if m.kind in ("health", "event", "state") else []


def _placed(msg: dict, kb: str, off: float) -> dict | None:
    """A stored message of kernel boot `kb` with its time placed by the boot's offset and the
    device's own time kept as `clk.claimed`; None when it is not this boot's, is placed
    already, or would land outside the plausible years."""
    c = msg.get("clk")
    at = clock.placed(msg.get("t"), c, off)
    if at is None or c.get("kb") != kb or "claimed" in c or \
            not clock.FLOOR_T <= at <= clock.CEILING_T:
        return None
    return {**msg, "clk": {**c, "claimed": msg["t"]}, "t": at}

class Placer:
    """The coordinator's side of it: offsets and pending boots kept in the store, so a
    restart goes on where this one stopped. Another coordinator sharing the store sees what
    this one learnt or settled within RELOAD_S: each re-reads both tables that often (a
    read of two small tables a minute)."""

    def __init__(self, store: Store, keep_s: float = 7 * 86400.0,
                 wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic):
        self.store = store
        self.keep_s, self._wall, self._mono = keep_s, wall, mono
        with store.transaction() as db:
            for sql in _DDL:
                db.execute(sql)
        self._migrate()
        self.offsets: dict[tuple[str, str], tuple[float, float]] = {}
        self._written: dict[tuple[str, str], tuple[float, float]] = {}  # as in clock_offsets
        self.waiting: dict[tuple[str, str, str], list] = {}  # as in clock_pending
        self._cursor: dict[tuple[str, str, str], tuple] = {}  # where a budget stopped
        self._refused_devices: set[str] = set()
        self.placed_total = 0
        self.settled_total = 0
        self.refused_total = 0  # boots past MAX_BOOTS not kept (their messages keep claims)
        self.read_total = 0  # rows settling has read
        self.reload()
        self._pruned = self._mono()

    def _migrate(self) -> None:
        """Add the columns a clock_pending made by an older version lacks."""
        for col, kind in _ADDED:
            try:
                self.store.read(f"SELECT {col} FROM clock_pending LIMIT 0")
            except Exception:  # either backend's "no such column"
                with self.store.transaction() as db:
                    db.execute(f"ALTER TABLE clock_pending ADD COLUMN {col} {kind}")
                    if col == "seen":
                        db.execute("UPDATE clock_pending SET seen = ?", (self._wall(),))

    def reload(self) -> None:
        """Offsets and pending boots as the store has them now (merged: the later offset
        wins; pending boots are the store's, another coordinator may have settled some)."""
        for d, kb, off, t in self.store.read("SELECT device, kb, off, t FROM clock_offsets"):
            if (d, kb) not in self.offsets or t > self.offsets[d, kb][1]:
                self.offsets[d, kb] = (off, t)
                self._written[d, kb] = (off, t)
        self.waiting = {(d, b, kb): [st, lo, hi] for d, b, kb, st, lo, hi in self.store.read(
            "SELECT device, boot, kb, stream, lo, hi FROM clock_pending")}
        self._cursor = {k: v for k, v in self._cursor.items() if k in self.waiting}
        # boots kept per device, for MAX_BOOTS without a scan of every device's
        self._n_off = Counter(k[0] for k in self.offsets)
        self._n_wait = Counter(k[0] for k in self.waiting)
        self._loaded = self._mono()

    def _capped(self, new: dict, have: dict, count: Counter, what: str) -> dict:
        """`new`'s entries a device may still add to `have` (MAX_BOOTS per device; `count`
        is have's per device and is moved with what is let in); past it they are counted and
        logged once per device, never kept: a device inventing a boot id per message costs
        only its own placing."""
        out = {}
        for k, v in sorted(new.items()):
            if k in have or count[k[0]] < MAX_BOOTS:
                out[k] = v
                count[k[0]] += k not in have
                continue
            self.refused_total += 1
            if k[0] not in self._refused_devices:
                self._refused_devices.add(k[0])
                log.warning("device %s: more than %d %s kept; the next are not (their "
                            "messages keep the device's claimed times)", k[0], MAX_BOOTS,
                            what)
        return out

    def before_store(self, inbound: Sequence[Inbound]) -> None:
        """Learn the batch's offsets and place what can be placed (call before storing)."""
        new = {k: v for k, v in learn(inbound).items()
               if k not in self.offsets or v[1] >= self.offsets[k][1]}
        if any(k not in self.offsets for k in new):
            new = self._capped(new, self.offsets, self._n_off,
                               "kernel boots' clock offsets")
        fresh = [k for k in new if k not in self.offsets]
        self.offsets.update(new)
        # written when new or moved past MOVED_S (a step, or slewing adding up), not with
        # every synced batch: that would be one more write per device and batch
        write = {k: v for k, v in new.items() if k not in self._written
                 or abs(v[0] - self._written[k][0]) > MOVED_S}
        found = place(inbound, self.offsets)
        waiting = {k: v for k, v in found.items() if k not in self.waiting}
        if waiting:
            waiting = self._capped(waiting, self.waiting, self._n_wait, "unplaced boots")
        # a known boot's range written again only when it grew past what settling reads
        # (lo lower, or hi more than WIDEN_S later): not once a batch
        widen = {}
        for k, (st, lo, hi) in found.items():
            if k not in self.waiting:
                continue
            w_st, w_lo, w_hi = self.waiting[k]
            if w_lo is None or st != w_st:
                continue
            if lo < w_lo or (hi is not None and w_hi is not None and hi > w_hi + WIDEN_S):
                widen[k] = [st, min(lo, w_lo), None if hi is None else max(hi, w_hi)]
        self.placed_total += sum(1 for m in inbound for it in _items(m)
                                 if isinstance(it.get("clk"), dict) and "claimed" in it["clk"])
        if write or waiting or widen:
            seen = self._wall()
            with self.store.transaction() as db:
                for (d, kb), (off, t) in sorted(write.items()):
                    db.execute("INSERT INTO clock_offsets (device, kb, off, t) VALUES "
                               "(?,?,?,?) ON CONFLICT (device, kb) DO UPDATE SET "
                               "off = excluded.off, t = excluded.t", (d, kb, off, t))
                for (d, b, kb), (st, lo, hi) in sorted(waiting.items()):
                    db.execute("INSERT INTO clock_pending (device, boot, kb, stream, lo, hi, "
                               "seen) VALUES (?,?,?,?,?,?,?) ON CONFLICT (device, boot) DO "
                               "NOTHING", (d, b, kb, st, lo, hi, seen))
                for (d, b, _), (_, lo, hi) in sorted(widen.items()):
                    db.execute("UPDATE clock_pending SET lo = ?, hi = ?, seen = ? WHERE "
                               "device = ? AND boot = ?", (lo, hi, seen, d, b))
            self.waiting.update(waiting)
            self.waiting.update(widen)
            self._written.update(write)
        for k in fresh:
            log.info("device %s: clock offset of kernel boot %s learnt (%+.3f s from "
                     "boottime); its unsynced messages are placed with it", k[0], k[1],
                     self.offsets[k][0])

    def settle(self, budget: int = BUDGET) -> int:
        """Rewrite messages stored before their boot's offset was known (call after
        storing), reading at most about `budget` rows: ingest waits for this, and the rest
        settles on later calls. Returns how many were placed. Also re-reads the store every
        RELOAD_S and prunes every PRUNE_S."""
        mono = self._mono()
        if mono - self._loaded >= RELOAD_S:
            self.reload()
        if mono - self._pruned >= PRUNE_S:
            self._pruned = mono
            self.prune(self._wall())
        done, left = 0, budget
        for key in sorted(k for k in self.waiting if (k[0], k[2]) in self.offsets):
            if left <= 0:
                break
            off = self.offsets[key[0], key[2]][0]
            n, read, finished = (self._settle_others if key[1].startswith(OTHERS)
                                 else self._settle)(key, off, left)
            done, left = done + n, left - read
            self.read_total += read
            if finished and self.waiting.pop(key, None) is not None:
                self._cursor.pop(key, None)
                self._n_wait[key[0]] -= 1
        self.settled_total += done
        return done

    def prune(self, now: float) -> None:
        """Forget offsets and pending boots older than `keep_s` (the longest retention of
        health and events: the messages they would place are gone by then; results kept
        longer keep their claims). An offset of a boot still running is learnt again from
        its next synced message."""
        cut = now - self.keep_s
        with self.store.transaction() as db:
            db.execute("DELETE FROM clock_offsets WHERE t < ?", (cut,))
            db.execute("DELETE FROM clock_pending WHERE seen < ? OR seen IS NULL", (cut,))
        self.offsets = {k: v for k, v in self.offsets.items() if v[1] >= cut}
        self._written = {k: v for k, v in self._written.items() if v[1] >= cut}
        self.reload()

    def _settle(self, key: tuple[str, str, str], off: float, budget: int
                ) -> tuple[int, int, bool]:
        """A process boot's results: (placed, rows read, finished). Read from its stream's
        first unplaced seq on (the results key index), up to the first row of another boot:
        one boot's seqs are contiguous in its stream."""
        device, boot, kb = key
        stream, lo, _ = self.waiting[key]
        done = read = 0
        finished = False
        if stream is None:  # noted by an older version: every stream of the device
            after = self._cursor.get(key, ("", -1))
        else:
            after = self._cursor.get(key, (stream, (lo if lo is not None else 0) - 1))
        while read < budget and not finished:
            with self.store.transaction() as db:
                if stream is None:
                    rows = db.execute(
                        "SELECT stream, seq, boot, body FROM results WHERE device = ? AND "
                        "(stream, seq) > (?, ?) ORDER BY stream, seq LIMIT ?",
                        (device, *after, CHUNK)).fetchall()
                else:
                    rows = db.execute(
                        "SELECT stream, seq, boot, body FROM results WHERE device = ? AND "
                        "stream = ? AND seq > ? ORDER BY seq LIMIT ?",
                        (device, stream, after[1], CHUNK)).fetchall()
                read += len(rows)
                grown = 0
                for st, seq, b, body in rows:
                    if not b:  # a refused item's marker (result_items.py): of no boot
                        after = (st, seq)
                        continue
                    if b != boot:
                        if stream is not None and seq > (lo or 0):
                            finished = True  # the next boot's results: this one's are done
                            break
                        continue
                    after = (st, seq)
                    r = _placed(json.loads(body), kb, off)
                    if r is None:
                        continue
                    at, new = r["t"], json.dumps(r, separators=(",", ":"))
                    db.execute("UPDATE results SET t = ?, body = ? WHERE device = ? AND "
                               "stream = ? AND seq = ?", (at, new, device, st, seq))
                    grown += (result_bytes(device, st, boot, new)
                              - result_bytes(device, st, boot, body))
                    done += 1
                if rows and not finished and rows[-1][:2] > after:
                    after = (rows[-1][0], rows[-1][1])
                if grown:  # the fair shares count the body (runtime/coordinator/quotas.py)
                    db.execute("UPDATE pool_usage SET bytes = bytes + ? WHERE device = ? AND "
                               "pool = 'results'", (grown, device))
                finished = finished or len(rows) < CHUNK
                if finished:
                    db.execute("DELETE FROM clock_pending WHERE device = ? AND boot = ?",
                               (device, boot))
        self._cursor[key] = after
        if done:
            log.info("device %s: placed %d results of boot %s (kernel boot %s) made before its "
                     "clock was synced", device, done, boot, kb)
        return done, read, finished

    def _settle_others(self, key: tuple[str, str, str], off: float, budget: int
                       ) -> tuple[int, int, bool]:
        """The health and event rows of the kernel boot stored unplaced, placed: (placed,
        rows read, finished). Read by the (device, t) indexes over the claimed times noted."""
        device, _, kb = key
        _, lo, hi = self.waiting[key]
        lo = -1e300 if lo is None else lo
        hi = 1e300 if hi is None else hi + WIDEN_S
        oc = self.store.order_col
        tables = ("health", "events")
        i, after_t, after_id = self._cursor.get(key, (0, lo, -1))
        done = read = 0
        while read < budget and i < len(tables):
            table = tables[i]
            with self.store.transaction() as db:
                rows = db.execute(
                    f"SELECT {oc}, t, body FROM {table} WHERE device = ? AND t >= ? AND "
                    f"t <= ? AND (t > ? OR (t = ? AND {oc} > ?)) ORDER BY t, {oc} LIMIT ?",
                    (device, lo, hi, after_t, after_t, after_id, CHUNK)).fetchall()
                read += len(rows)
                grown = 0
                for rid, _t, body in rows:
                    msg = _placed(json.loads(body), kb, off)
                    if msg is None:
                        continue
                    at, claimed = msg["t"], msg["clk"]["claimed"]
                    new = json.dumps(msg)  # as ingest writes them
                    db.execute(f"UPDATE {table} SET t = ?, body = ? WHERE {oc} = ?",
                               (at, new, rid))
                    if table == "health":  # the dashboard's timeline row beside it
                        db.execute("UPDATE health_points SET t = ? WHERE device = ? AND "
                                   "t = ?", (at, device, float(claimed)))
                        grown += health_bytes(device, new) - health_bytes(device, body)
                    else:
                        kind = str(msg.get("type", ""))
                        grown += event_bytes(device, kind, new) - event_bytes(device, kind,
                                                                             body)
                    done += 1
                if grown:
                    db.execute("UPDATE pool_usage SET bytes = bytes + ? WHERE device = ? "
                               "AND pool = ?", (grown, device, table))
                if rows:
                    after_t, after_id = rows[-1][1], rows[-1][0]
                if len(rows) < CHUNK:
                    i, after_t, after_id = i + 1, lo, -1
                    if i == len(tables):
                        db.execute("DELETE FROM clock_pending WHERE device = ? AND boot = ?",
                                   (device, OTHERS + kb))
        self._cursor[key] = (i, after_t, after_id)
        if done:
            log.info("device %s: placed %d health and event messages of kernel boot %s made "
                     "before its clock was synced", device, done, kb)
        return done, read, i == len(tables)
