"""The coordinator's health age (stats `health_age_s`, Prometheus
`edgerun_coordinator_health_age_seconds`) from a device whose clock is not synced: found in a
field run (2026-12-07), a daemon under faketime a week behind, then a day ahead, made the
fleet's p99 604801 s and the recent p50 -86398 s, so an alert on the metric fired for one
box without a battery clock (docs/clocks.md: the normal case for a Pi)."""

from __future__ import annotations

import json
import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator

WEEK = 7 * 86400.0


def _health(t: float, synced: bool) -> bytes:
    return json.dumps({"v": 1, "t": t, "boot": "b1",
                       "clk": {"sync": synced, "kb": "kb1", "bt": 100.0}}).encode()


def test_an_unsynced_stamp_does_not_set_the_fleets_health_age(tmp_path):
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    try:
        now = time.time()
        c._ingest([("edgerun/v1/f/d1/health", _health(now - 0.5, True), now),
                   ("edgerun/v1/f/d2/health", _health(now - WEEK, False), now)])
        ages = c.stats()["health_age_s"]
        assert ages["n"] >= 1
        assert 0 <= ages["p50"] < 60 and 0 <= ages["p99"] < 60, ages
    finally:
        c.store.close()
