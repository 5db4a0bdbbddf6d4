"""The coordinator's stats and queues (GET /api/v1/stats, /metrics): its counters, the health
age distribution, the store's usage and quarantine, and every queue of held work with its
bound. Read from a running Coordinator (service.py), under its views lock where it says so.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

RECENT_S = 10.0  # stats' health_age_recent_s: health taken in the last this many seconds


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
        ages_in, taken_in = list(c.health_age_s), list(c._health_taken)
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
            "store": c.store_watch.status(c.mono())}


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
