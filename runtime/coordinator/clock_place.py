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
from collections.abc import Sequence
from typing import Any

from runtime.coordinator.quotas import event_bytes, health_bytes, result_bytes
from runtime.coordinator.store import Inbound, Store
from runtime.wire import clock

log = logging.getLogger("edgerun.coordinator")

_DDL = (
    "CREATE TABLE IF NOT EXISTS clock_offsets (device TEXT NOT NULL, kb TEXT NOT NULL, "
    "off DOUBLE PRECISION NOT NULL, t DOUBLE PRECISION NOT NULL, PRIMARY KEY (device, kb))",
    "CREATE TABLE IF NOT EXISTS clock_pending (device TEXT NOT NULL, boot TEXT NOT NULL, "
    "kb TEXT NOT NULL, PRIMARY KEY (device, boot))",
)
MOVED_S = 0.5  # an offset is written again when it moved more than this
CHUNK = 500  # rows rewritten per transaction when a boot's offset arrives
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
          ) -> set[tuple[str, str, str]]:
    """Move the `t` of every unsynced item with a known offset to where it belongs (its claim
    into `clk.claimed`), in place; returns the (device, process boot, kernel boot) of the
    results that could not be placed yet."""
    waiting = set()
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
                waiting.add((m.device, item.get("boot") or m.msg["boot"], c["kb"]))
            elif m.kind in ("health", "event"):  # "*": the kernel boot's health and events
                waiting.add((m.device, OTHERS + c["kb"], c["kb"]))
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
    """The coordinator's side of it: offsets and pending results kept in the store (so a
    restart, or another coordinator sharing the store, goes on where this one stopped)."""

    def __init__(self, store: Store):
        self.store = store
        with store.transaction() as db:
            for sql in _DDL:
                db.execute(sql)
        self.offsets = {(d, kb): (off, t) for d, kb, off, t in store.read(
            "SELECT device, kb, off, t FROM clock_offsets")}
        self._written = {k: v[0] for k, v in self.offsets.items()}  # as in clock_offsets
        self.waiting = {(d, b, kb) for d, b, kb in store.read(
            "SELECT device, boot, kb FROM clock_pending")}
        self.placed_total = 0
        self.settled_total = 0

    def before_store(self, inbound: Sequence[Inbound]) -> None:
        """Learn the batch's offsets and place what can be placed (call before storing)."""
        new = {k: v for k, v in learn(inbound).items()
               if k not in self.offsets or v[1] >= self.offsets[k][1]}
        fresh = [k for k in new if k not in self.offsets]
        self.offsets.update(new)
        # written when new or moved past MOVED_S (a step, or slewing adding up), not with
        # every synced batch: that would be one more write per device and batch
        write = {k: v for k, v in new.items() if k not in self._written
                 or abs(v[0] - self._written[k]) > MOVED_S}
        waiting = place(inbound, self.offsets) - self.waiting
        self.placed_total += sum(1 for m in inbound for it in _items(m)
                                 if isinstance(it.get("clk"), dict) and "claimed" in it["clk"])
        if write or waiting:
            with self.store.transaction() as db:
                for (d, kb), (off, t) in sorted(write.items()):
                    db.execute("INSERT INTO clock_offsets (device, kb, off, t) VALUES "
                               "(?,?,?,?) ON CONFLICT (device, kb) DO UPDATE SET "
                               "off = excluded.off, t = excluded.t", (d, kb, off, t))
                for row in sorted(waiting):
                    db.execute("INSERT INTO clock_pending (device, boot, kb) VALUES (?,?,?) "
                               "ON CONFLICT (device, boot) DO NOTHING", row)
            self.waiting.update(waiting)
            self._written.update({k: v[0] for k, v in write.items()})
        for k in fresh:
            log.info("device %s: clock offset of kernel boot %s learnt (%+.3f s from "
                     "boottime); its unsynced messages are placed with it", k[0], k[1],
                     self.offsets[k][0])

    def settle(self) -> int:
        """Rewrite the results stored before their boot's offset was known (call after
        storing); returns how many were placed."""
        done = 0
        for key in sorted(k for k in self.waiting if (k[0], k[2]) in self.offsets):
            off = self.offsets[key[0], key[2]][0]
            done += self._settle_others(key[0], key[2], off) if key[1].startswith(OTHERS) \
                else self._settle(*key, off)
            self.waiting.discard(key)
        self.settled_total += done
        return done

    def _settle(self, device: str, boot: str, kb: str, off: float) -> int:
        done, after = 0, ("", 0)
        while True:
            with self.store.transaction() as db:
                rows = db.execute(
                    "SELECT stream, seq, body FROM results WHERE device = ? AND boot = ? AND "
                    "(stream, seq) > (?, ?) ORDER BY stream, seq LIMIT ?",
                    (device, boot, *after, CHUNK)).fetchall()
                grown = 0
                for stream, seq, body in rows:
                    r = _placed(json.loads(body), kb, off)
                    if r is None:
                        continue
                    at, new = r["t"], json.dumps(r, separators=(",", ":"))
                    db.execute("UPDATE results SET t = ?, body = ? WHERE device = ? AND "
                               "stream = ? AND seq = ?", (at, new, device, stream, seq))
                    grown += (result_bytes(device, stream, boot, new)
                              - result_bytes(device, stream, boot, body))
                    done += 1
                if grown:  # the fair shares count the body (runtime/coordinator/quotas.py)
                    db.execute("UPDATE pool_usage SET bytes = bytes + ? WHERE device = ? AND "
                               "pool = 'results'", (grown, device))
                if len(rows) < CHUNK:
                    db.execute("DELETE FROM clock_pending WHERE device = ? AND boot = ?",
                               (device, boot))
            if len(rows) < CHUNK:
                break
            after = (rows[-1][0], rows[-1][1])
        if done:
            log.info("device %s: placed %d results of boot %s (kernel boot %s) made before its "
                     "clock was synced", device, done, boot, kb)
        return done

    def _settle_others(self, device: str, kb: str, off: float) -> int:
        """The health and event rows of kernel boot `kb` stored unplaced, placed."""
        oc, done = self.store.order_col, 0
        for table in ("health", "events"):
            after = -1
            while True:
                with self.store.transaction() as db:
                    rows = db.execute(
                        f"SELECT {oc}, body FROM {table} WHERE device = ? AND {oc} > ? AND "
                        f"body LIKE ? ORDER BY {oc} LIMIT ?",
                        (device, after, f"%{kb}%", CHUNK)).fetchall()
                    grown = 0
                    for rid, body in rows:
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
                    if len(rows) < CHUNK and table == "events":
                        db.execute("DELETE FROM clock_pending WHERE device = ? AND boot = ?",
                                   (device, OTHERS + kb))
                if len(rows) < CHUNK:
                    break
                after = rows[-1][0]
        if done:
            log.info("device %s: placed %d health and event messages of kernel boot %s made "
                     "before its clock was synced", device, done, kb)
        return done
