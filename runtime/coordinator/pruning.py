"""The coordinator store's retention: health and events past their age, results past
`retention_days`, the devices' data past the cap (the pool most over its fair share first,
budget.py), and the streams whose ack stalled. The retention thread (retention.py) runs these.

Only results at or below their stream's ack are deleted for age or for the oldest: the ack is
kept in `streams`, apart from the rows, so pruning cannot lower it. Deletes run in chunks,
each its own short transaction through the store's dialect, so ingest is never held off long;
on PostgreSQL whole day partitions are dropped where they may be.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter

from runtime.coordinator import quotas
from runtime.coordinator.budget import ACKED_OLDEST, Budget
from runtime.coordinator.ingest import MEMORY_STREAM_PREFIX
from runtime.coordinator.store_rows import (
    PENDING_DDL,
    PENDING_WIDEN_S,
    Dialect,
    Stalled,
    charge,
    query,
    uncharge,
)
from runtime.wire import clock

# Rows past their age: stamped before the cut in a plausible time, or, when their device has
# no boot waiting to be placed (clock_place.py), before the cut or claimed ahead of now by
# more than UNPLACEABLE_AHEAD_S (a synced stamp is refused past future_skew_s); and never
# one whose claim lies in the range a pending boot of its device noted for its health and
# events ("*<kb>": lo..hi, hi rewritten only PENDING_WIDEN_S later): a clock a week behind
# claims a plausible time, and with a week's retention its rows went before the sync came
_AGED = ("WHERE ((t < ? AND t >= ?) OR ((t < ? OR t > ?) AND device NOT IN "
         "(SELECT device FROM clock_pending))) AND NOT EXISTS (SELECT 1 FROM clock_pending p "
         "WHERE p.device = {table}.device AND p.boot LIKE '*%' AND "
         f"t >= COALESCE(p.lo, -1e300) AND t <= COALESCE(p.hi + {PENDING_WIDEN_S}, 1e300))")
UNPLACEABLE_AHEAD_S = 86400.0
# the earliest claim a pending boot of any device waits to have placed: no day partition of
# health ending after it is dropped (the rows before it in a kept one are deleted by row)
_PENDING_LO = "SELECT MIN(lo) FROM clock_pending WHERE boot LIKE '*%' AND lo >= ?"


def _aged(now: float, keep: float) -> tuple[float, float, float, float]:
    """_AGED's parameters at `now` for a retention of `keep` seconds."""
    return now - keep, clock.FLOOR_T, now - keep, now + UNPLACEABLE_AHEAD_S


class Pruning:
    """Retention's deletes in the store, through its dialect and `budget` (see module
    docstring)."""

    def __init__(self, d: Dialect, budget: Budget):
        self._d, self._budget = d, budget
        # what the last prune_results reclaimed from devices over their share: device ->
        # {"results": n, "unacked": n, "health": n, "events": n, "before": B, "after": B}
        self.reclaimed: dict[str, dict[str, int]] = {}

    def prune(self, keep_health_s: float, keep_events_s: float, now: float | None = None
              ) -> None:
        """Drop health and events older than their retention (results are never pruned here).
        On PostgreSQL whole day partitions of health go first; rows left are deleted. `now`:
        the time ages are judged at (the retention's steady wall clock; default the wall)."""
        now = time.time() if now is None else now
        with self._d.transaction() as db:
            db.execute(PENDING_DDL)
            (lo,), = db.execute(_PENDING_LO, (clock.FLOOR_T,)).fetchall()
        before = now - keep_health_s if lo is None else min(now - keep_health_s, lo)
        self._unuse(self._d.drop_partitions("health", before, acked_only=False),
                    results=False)
        with self._d.transaction() as db:
            gone: Counter = Counter()
            for pool, keep in (("health", keep_health_s), ("events", keep_events_s)):
                # a claim before 2025 (a box booted at 1970) is no age while its device has
                # a boot waiting to be placed (clock_place.py): it was deleted at once, and
                # the sync found nothing left to place; one no boot can place goes, and so
                # does a claim ahead (a box reading 2099), which was kept until its date
                aged = _AGED.format(table=pool)
                for d, n in db.execute(f"DELETE FROM {pool} {aged} RETURNING device, "
                                       f"{quotas.POOL_BYTES_SQL[pool]}",
                                       _aged(now, keep)).fetchall():
                    gone[d, pool] += int(n)
            db.execute(f"DELETE FROM health_points {_AGED.format(table='health_points')}",
                       _aged(now, keep_health_s))
            uncharge(db, gone)

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
            # a row received while the coordinator's clock read 1970 (or past 2100) has no
            # age to judge: once the clock was right it looked 56 years old and went at the
            # first pass; it stays until the size cap takes it
            while n := self._delete_results(f"{eligible} AND r.received < ? AND r.received "
                                            "BETWEEN ? AND ? LIMIT ?",
                                            (now - max_age_s, clock.FLOOR_T, clock.CEILING_T,
                                             chunk)):
                out["results_by_age"] += n
        if max_bytes > 0:
            self._budget.set_cap(max_bytes, reserved)
            self._reclaim(max_bytes, chunk, out)
            if self._d.name == "sqlite" and self._budget.over_cap(max_bytes):
                # still over with no device over its share: the overhead per logical byte
                # was measured on another mix of rows; measured again, the budget shrinks
                # and the devices holding most are over their share again. Nothing of a
                # device within its share is deleted, ever (otherwise the oldest health of
                # every device went, a day's partition of it on PostgreSQL). (PostgreSQL's
                # cap is the logical budget: its files do not shrink by row deletes.)
                self._budget.remeasure(max_bytes, reserved)
                self._reclaim(max_bytes, chunk, out)
        if any(out.values()) or self._budget.shed:  # (admission's deletes count too)
            self._d.after_prune()
        return out

    def _reclaim(self, max_bytes: int, chunk: int, out: dict[str, int]) -> None:
        """While the store is over its cap, delete from the pool (device and kind of row) most
        over its quota: its oldest acked results, oldest health or oldest events, and for
        results, when other devices hold data and nothing acked is left, its newest unacked
        ones. A pool within its quota is never taken from."""
        skip: set[tuple[str, str]] = set()  # pools over quota with nothing that may go
        for _ in range(10_000):
            if not self._budget.over_cap(max_bytes):
                return
            pools = self._budget.pools()
            over = [o for o in quotas.over_share(pools, self._budget.budget_bytes)
                    if o[:2] not in skip]
            if not over:
                return
            device, pool, excess = over[0]
            others = any(b > 0 for (d, _), b in pools.items() if d != device)
            held = self._budget.usage().get(device, 0)
            mine = self.reclaimed.setdefault(device, {"results": 0, "unacked": 0, "health": 0,
                                                      "events": 0, "before": held,
                                                      "after": held})
            with self._d.transaction() as db:
                rows = min(chunk, max(1, excess // max(1, self._budget.pool_row_bytes(
                    db, device, pool)) + 1))
                if pool != "results":
                    n = len(self._budget.delete_oldest(db, pool, device, rows))
                    key = pool
                elif n := len(self._budget.delete_results(db, ACKED_OLDEST, (device, rows))):
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
            mine["after"] = self._budget.usage().get(device, 0)

    def quarantine_stalled(self, wait_s: float, now: float | None = None) -> list[Stalled]:
        """Streams whose ack has not moved for `wait_s` since a batch's floor was first not
        stored (the floor is never sent, or never stored): their rows above the ack are
        deleted and an event `stream_quarantined` is stored for the device. Nothing a
        device still needs is lost: it deletes only what an ack covers, so it still holds
        these and re-sends them; a stream that moved meanwhile is only forgotten."""
        now = time.time() if now is None else now
        out = []
        for device, stream, since, then in query(
                self._d, "SELECT device, stream, since, acked FROM stalls WHERE since < ? "
                "ORDER BY device, stream", (now - wait_s,)):
            with self._d.transaction() as db:
                self._d.lock_devices(db, [device])  # ingest of this device waits
                row = db.execute("SELECT acked FROM streams WHERE device=? AND stream=?",
                                 (device, stream)).fetchone()
                acked = int(row[0]) if row else 0
                db.execute("DELETE FROM stalls WHERE device=? AND stream=?", (device, stream))
                if acked > then:
                    continue  # it moved: not stalled (a new stall is noted by ingest)
                gone = self._budget.delete_results(
                    db, "SELECT device, stream, seq FROM results WHERE device = ? AND "
                    "stream = ? AND seq > ?", (device, stream, acked))
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
                charge(db, Counter({(device, "events"): quotas.event_bytes(
                    device, "stream_quarantined", body)}))
                out.append(Stalled(device, stream, acked, rows, size, since))
        if out:
            self._d.after_prune()
        return out

    def forget_memory_streams(self) -> int:
        """Delete the `streams` rows of memory-only outboxes' streams (ingest.memory_stream)
        that hold no result and wait for no floor (no `stalls` row); how many. Their results
        went by retention; such a stream is never counted by the stream cap, so its row is
        kept only beside results of the device's fair share. Nothing is lost: an outbox in
        memory holds only what its ack has not covered, and a row that comes back (its
        boot still running) is made again by the next ack from its floor. Each device's
        rows go with its ingest held off (lock_devices): a batch storing on such a stream
        as the row went would leave its results without the row that lets them age out."""
        # substr, not LIKE: SQLite's LIKE ignores case, ingest.memory_stream does not
        prefix = MEMORY_STREAM_PREFIX
        empty = (f"substr(stream, 1, {len(prefix)}) = ? AND NOT EXISTS (SELECT 1 FROM "
                 f"{self._d.keys_table} r WHERE r.device = streams.device AND r.stream = "
                 "streams.stream) AND NOT EXISTS (SELECT 1 FROM stalls t WHERE t.device = "
                 "streams.device AND t.stream = streams.stream)")
        n = 0
        for (device,) in query(self._d, f"SELECT DISTINCT device FROM streams WHERE {empty} "
                               "ORDER BY device", (prefix,)):
            with self._d.transaction() as db:
                self._d.lock_devices(db, [device])
                n += len(db.execute(f"DELETE FROM streams WHERE device = ? AND {empty} "
                                    "RETURNING device", (device, prefix)).fetchall())
        return n

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
            return len(self._budget.delete_results(db, which, args))

    def _unuse(self, per_device: dict[str, tuple[int, int]], results: bool) -> None:
        """Take dropped partitions' (rows, bytes) per device off the counts and usage."""
        if per_device:
            with self._d.transaction() as db:
                if results:
                    db.executemany("UPDATE result_counts SET n = n - ? WHERE device = ?",
                                   [(n, d) for d, (n, _) in sorted(per_device.items()) if d])
                pool = "results" if results else "health"
                uncharge(db, Counter({(d, pool): b for d, (_, b) in per_device.items() if d}))
