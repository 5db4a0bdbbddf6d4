"""The coordinator's stats and queues (GET /api/v1/stats, /metrics): its counters, the health
age distribution, the store's usage and quarantine, and every queue of held work with its
bound. Read from a running Coordinator (service.py), under its views lock where it says so.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict
from typing import Any

RECENT_S = 10.0  # stats' health_age_recent_s: health taken in the last this many seconds


class HealthAges:
    """How old each stored health was (its stamp to just after its batch committed) and when
    it was taken: stats' `health_age_s` and its recent window. Appended under the
    coordinator's views lock."""

    def __init__(self, keep: int = 20_000):
        self.ages: deque[float] = deque(maxlen=keep)
        self.taken: deque[float] = deque(maxlen=keep)

    def add(self, msg: dict[str, Any]) -> None:
        """One stored health's age, measured now; none from a stamp whose clock says it is
        unsynced (a week-behind box without a battery clock made the fleet's p99 a week)."""
        clk = msg.get("clk")
        if clk is None or clk.get("sync") is not False:
            taken = time.time()
            self.ages.append(taken - msg["t"])
            self.taken.append(taken)


def stats(c: Any) -> dict[str, Any]:
    """Ingest counters and the health age distribution, the store's usage and quarantine
    (read from the store: raises when it cannot be read) and `own`'s figures."""
    q = c.store.quarantine_counts()
    return {**own(c),
            "store_usage": {"budget_bytes": c.store.budget_bytes,
                            "overhead": c.store.overhead,
                            "by_device": c.store.usage(),
                            "refused_over_share": dict(c.store.refused_over_share)},
            "quarantined": {"total": sum(q.values()), "by_device": q}}


def own(c: Any) -> dict[str, Any]:
    """The figures of `stats` the coordinator holds itself, never read from the store:
    what /metrics still shows while the store cannot be read (its state among them)."""
    with c._views_lock:  # the two deques are appended together under it
        ages_in, taken_in = list(c.health_ages.ages), list(c.health_ages.taken)
    ages = sorted(ages_in)
    def pct(q, ages=ages):
        return (ages[min(len(ages) - 1, int(q * len(ages)))] if ages else None)
    # the last RECENT_S only: a start's backlog (births, first wave) out of the figure
    since = time.time() - RECENT_S
    recent = sorted(a for a, t in zip(ages_in, taken_in, strict=True) if t >= since)
    return {"counters": dict(c.counters), "inbox": c._inbox.qsize(),
            "queues": c.queues(),
            "health_age_s": {"p50": pct(0.5), "p99": pct(0.99), "n": len(ages)},
            "health_age_recent_s": {"p50": pct(0.5, recent), "p99": pct(0.99, recent),
                                    "n": len(recent), "window_s": RECENT_S},
            "connected": c.connected.is_set(), "threads": c.threads_alive(),
            "mqtt": asdict(c._conn.stats), "bundle_chunks": c.chunks.stats(),
            "webhook": c.webhook.stats() if c.webhook is not None else None,
            "store": c.store_watch.status(c.mono()),
            # the wall clock's steps since the start (fleet silence and alert delays ignore
            # them: runtime/wire/clock.py StepClock)
            "clock": {"steps_total": c.clock.jumps_total, "stepped_s": round(c.clock.step, 3)}}


def queues(c: Any) -> dict[str, dict[str, Any]]:
    """Every queue and table of held work with its bound and what passed it: the inbox,
    the replies awaited, and the coalescers of births, healths and events."""
    n, p = c.counters, c.commander.pending
    return {"inbox": {"size": c._inbox.qsize(), "max": c._inbox.maxsize,
                      "dropped": n["inbox_full_dropped"] + c._inbox.dropped_total(),
                      "per_device_max": c._inbox.per_device,
                      "dropped_over_share": c._inbox.dropped_total(),
                      **c._inbox.full_stats()},
            "pending_replies": {"size": len(p), "max": p.max_size, "dropped": p.dropped,
                                "expired": p.expired},
            "births": c.births.stats(), **c.admission.stats()}
