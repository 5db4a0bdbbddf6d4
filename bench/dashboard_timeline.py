"""How long the dashboard's timeline query takes on a day of one device's health.

    python bench/dashboard_timeline.py [--seconds 86400] [--store /tmp/timeline.db]

Ingests `--seconds` health messages (one per second, the size of a real daemon's health)
through `Store.ingest`, then times `Store.health_series` for a 1 h, 6 h and the whole window
with the dashboard's columns and 600 buckets, and compares with extracting the same fields
from the stored JSON bodies (what a timeline without `health_points` would cost).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.coordinator import dashboard
from runtime.coordinator.store import TIMELINE, Inbound, Store

HEALTH = {
    "v": 1, "boot": "b1", "temp_c": 60.0, "passive_trip_c": 85.0, "throttled": False,
    "battery_frac": 0.5, "harvest_w": 1.0, "sensor_problems": [], "model": "inspection",
    "choice": "inspection/fp16@onnxruntime:CPU/t1,opt=all", "choice_reason": "x" * 200,
    "rung": 2, "rungs": 4, "accuracy": 0.95, "energy_mj": 30.0, "energy_source": "model",
    "rung_energy_mj": 30.0, "power_w": 4.0,
    "governor": {"policy": "step_wise", "level": 1, "budget_w": 3.0, "reason": "y" * 100,
                 "enabled": True, "disabled_reason": None, "temp_filtered_c": 60.0,
                 "slope_c_per_min": 0.1, "physics_bounded": False},
    "pipeline": {"rate_hz": 20.0, "latency_ms": {"p50": 5.0, "p95": 9.0}, "frames": 1000,
                 "results": 1000, "frames_bad": {"total": 0},
                 "labels": {"ok": 990, "defect": 10}},
    "slo": {"target_ms": 20.0, "compliance": 0.99},
    "backlog": {"results_held": 3, "bytes": 300, "oldest_seq": 5, "evicted_total": 0},
    "mqtt": {"connected": True, "acked_seq": 1000, "resends": 0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=86400)
    ap.add_argument("--store", type=Path, default=None)
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory() if a.store is None else None
    path = a.store or Path(tmp.name) / "timeline.db"
    store = Store(path)
    now = time.time()
    t0 = time.perf_counter()
    for k in range(0, a.seconds, 500):
        store.ingest([Inbound("d1", "health", {**HEALTH, "t": now - a.seconds + i,
                                               "temp_c": 60 + (i % 100) / 10})
                      for i in range(k, min(a.seconds, k + 500))])
    per = (time.perf_counter() - t0) / a.seconds
    print(f"ingested {a.seconds} health messages: {per * 1e6:.0f} us each")
    paths = dict(TIMELINE)
    for window in (3600, 21600, a.seconds):
        t0 = time.perf_counter()
        rows = store.health_series("d1", now - window, now + 300, dashboard.HISTORY,
                                   dashboard.MAX_POINTS)
        fast = time.perf_counter() - t0
        cols = ", ".join(f"{agg}(json_extract(body, '$.{'.'.join(paths[name])}'))"
                         for name, agg in dashboard.HISTORY)
        width = window / dashboard.MAX_POINTS
        t0 = time.perf_counter()
        store._query(f"SELECT MAX(t), {cols} FROM health WHERE device=? AND t >= ? "
                     "GROUP BY CAST((t - ?) / ? AS INTEGER)",
                     ("d1", now - window, now - window, width))
        slow = time.perf_counter() - t0
        print(f"window {window:>6} s: {len(rows)} points in {fast * 1e3:.0f} ms "
              f"(from the JSON bodies: {slow * 1e3:.0f} ms)")
    store.close()


if __name__ == "__main__":
    main()
