"""The coordinator's retention: results past `retention_days`, then the oldest data while the
store uses more than `max_store_mb` (the devices over their fair share first, quotas.py), the
streams whose ack floor stalled, and the bundle shelf's orphaned chunk rows.

A pass runs every `retention_interval_s` on the coordinator's `retention` thread, or sooner
when ingest finds the store over its budget (`due`), at most every `retention_wake_s`; one pass
at a time. What each pass deleted is logged and counted in the coordinator's stats.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.bundles import Shelf
from runtime.coordinator.store import Store
from runtime.wire import clock as wire_clock

log = logging.getLogger("edgerun.coordinator")


class Retention:
    """One coordinator's retention passes (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig, store: Store, shelf: Shelf,
                 counters: collections.Counter, stop: threading.Event):
        self.cfg, self.store, self.shelf = cfg, store, shelf
        self._counters = counters
        self._stop = stop
        self.due = threading.Event()  # set by ingest when the store is full
        # ages judged by a wall clock that never steps forward past the monotonic clock: a
        # coordinator whose clock jumps 7 days ahead must not delete a week of results
        self.clock = wire_clock.SteadyWall(what="retention")
        self._plausible = True  # whether the last age_now() read a plausible clock
        self._lock = threading.Lock()

    def loop(self) -> None:
        """The retention thread: a pass when due (see module docstring) until the stop."""
        last = time.monotonic()
        while not self._stop.is_set():
            # every retention_interval_s, or sooner when ingest found the store full (at most
            # every retention_wake_s: a store that cannot shrink must not spin this loop)
            self.due.wait(max(0.0, self.cfg.retention_interval_s
                              - (time.monotonic() - last)))
            if self._stop.wait(max(0.0, self.cfg.retention_wake_s
                                   - (time.monotonic() - last))):
                return
            self.due.clear()
            last = time.monotonic()
            try:
                self.run()
            except Exception:  # a failed pass is retried next interval; ingest is unaffected
                if self._stop.is_set():
                    return
                self._counters["retention_errors"] += 1
                log.exception("retention pass failed; retrying in %.0f s",
                              self.cfg.retention_interval_s)

    def age_now(self) -> float | None:
        """The time results, health and events are judged old at (`self.clock`), or None
        while it reads before 2025 or after 2100: then nothing is deleted by age. The clock's
        monotonic guard holds only steps made while running; a coordinator that started at
        2100 (a corrupt RTC, a bad time server at boot) judged the fleet's whole history 74
        years old at its first pass and deleted it. Said once each way; the size cap still
        applies (it needs no clock)."""
        now = self.clock.now()
        plausible = age_clock_plausible(now)
        if plausible != self._plausible:
            self._plausible = plausible
            if plausible:
                log.info("retention: the clock reads %s again; results, health and events "
                         "are deleted by age again", _iso(now))
            else:
                self._counters["retention_clock_implausible"] += 1
                log.error("retention: the clock reads %s, %s; results, health and events are "
                          "not deleted by age until it reads a time in 2025..2100 "
                          "(max_store_mb still applies)", _iso(now),
                          "after 2100" if now > wire_clock.CEILING_T else "before 2025")
        return now if plausible else None

    def run(self) -> dict[str, int]:
        """One retention pass: results past `retention_days`, then the oldest data while the
        store uses more than `max_store_mb`. Logs what it deleted and counts it in stats.
        One pass at a time (the retention thread, a caller): two would each reclaim from
        what the other already took."""
        with self._lock:
            return self._run()

    def _run(self) -> dict[str, int]:
        cfg = self.cfg
        self.store.maintain()  # PostgreSQL: the coming days' partitions
        cap = int(cfg.max_store_mb * 1024 * 1024)
        shelf = self.shelf.stored_bytes() if cap > 0 else 0
        if cap > 0:  # the bundles in the store are not what the cap is for: never make
            cap += shelf  # room for them by deleting results
        now = self.age_now()
        done = self.store.prune_results(cfg.retention_days * 86400 if now is not None else 0,
                                        cap, reserved=shelf, now=now)
        stalled = self.store.quarantine_stalled(cfg.floor_wait_s)
        self._counters["memory_streams_forgotten"] += self.store.forget_memory_streams()
        self.sweep_shelf()
        self._counters["retention_runs"] += 1
        for key, n in done.items():
            self._counters[f"pruned_{key}"] += n
        for device, got in sorted(self.store.reclaimed.items()):
            self._counters["reclaimed_over_share"] += 1
            log.warning("retention: device %s was over its share of max_store_mb (it held "
                        "%.2f MB, now %.2f); deleted %d of its acked results, %d unacked (it "
                        "re-sends them), %d health, %d events", device, got["before"] / 2**20,
                        got["after"] / 2**20, got["results"], got["unacked"], got["health"],
                        got["events"])
        for (device, pool), n in sorted(self.store.take_shed().items()):
            self._counters[f"shed_{pool}"] += n
            log.warning("retention: device %s was over its quota of %s in a full store; "
                        "admission deleted %d of its oldest %s before writing its new ones",
                        device, pool, n, "acked results" if pool == "results" else pool)
        for st in stalled:
            self._counters["streams_quarantined"] += 1
            log.warning("device %s: stream %r quarantined: its ack stayed at %d for %.0f s "
                        "(floor_wait_s %g), so the %d results above it (%.2f MB) were "
                        "deleted; the device still holds them and may re-send from its floor",
                        st.device, st.stream, st.acked, time.time() - st.since,
                        cfg.floor_wait_s, st.rows, st.bytes / 2**20)
        if done["results_by_age"]:
            log.info("retention: deleted %d acked results older than %g days",
                     done["results_by_age"], cfg.retention_days)
        # what the size cap took beyond the devices over their share (named above)
        fair = {"results": 0, "health": 0, "events": 0}
        for got in self.store.reclaimed.values():
            fair["results"] += got["results"] + got["unacked"]
            fair["health"] += got["health"]
            fair["events"] += got["events"]
        by_size = {k: n - fair[k.split("_")[0]] for k, n in done.items()
                   if k.endswith("by_size") and n - fair[k.split("_")[0]]}
        if by_size:
            log.warning("retention: the store was over max_store_mb = %g with no device over "
                        "its share; deleted the oldest %s of all devices (now %.1f MB)",
                        cfg.max_store_mb,
                        ", ".join(f"{n} {k.split('_')[0]}" for k, n in by_size.items()),
                        self.store.used_bytes() / 2**20)
        return done

    def set_cap(self) -> None:
        """Give the store its cap for the fair shares (bundle bytes are not the devices')."""
        cap = int(self.cfg.max_store_mb * 1024 * 1024)
        try:
            shelf = self.shelf.stored_bytes() if cap > 0 else 0
            self.store.set_cap(cap + shelf if cap > 0 else 0, shelf)
        except Exception as e:  # the shares then start with the first retention pass
            log.error("could not measure the store for its fair shares: %s", e)

    def sweep_shelf(self, at_start: bool = False) -> None:
        """Chunk rows no bundle needs out of the store (Shelf.sweep logs what it removed);
        a failure is logged, never stops a start or a retention pass."""
        try:
            got = self.shelf.sweep(at_start)
        except Exception:
            log.exception("could not sweep the bundle shelf's chunk rows; trying again at the "
                          "next retention pass")
            return
        self._counters["bundle_rows_swept"] += got["rows"]


def age_clock_plausible(t: float) -> bool:
    """Whether ages may be judged at wall time `t`: within 2025-01-01..2100-01-01, the
    device clock's own bounds (runtime/wire/clock.py)."""
    return wire_clock.FLOOR_T <= t <= wire_clock.CEILING_T


def _iso(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f} s since the epoch"
