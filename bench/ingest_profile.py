"""Where a coordinator's ingest CPU goes, on the shipped path, at the 10k scenario's mix.

Feeds `Coordinator._ingest` (admit: topic, JSON, compiled schema; store; view; acks) the raw
MQTT payloads of N devices sending a health and a one-result batch each (what
runtime/tools/fleetsim.py sends), in batches of `ingest_batch`, with `_refresh` once per simulated
second as the ingest loop does, on SQLite and/or a throw-away PostgreSQL; prints CPU per
message and, with --profile, cProfile's top functions (cProfile inflates deep call trees,
so read the ranking, not the absolute numbers).

With --births: the start of a shared-subscription coordinator instead, every device's retained
birth (as the simulator publishes it) in ingest batches with share_group set (births claimed in
the store), printed side by side in the same run with the path before the birth burst was
batched ("before": one desired-state query per birth as before `Rollouts.on_online_many`, and
the states written and the views read with the portable statements: a statement per state,
an IN list of a parameter per device, as SQLiteDialect does).

Usage: python bench/ingest_profile.py [--devices 10000] [--backends sqlite,postgresql]
       [--births [--repeat 3]] [--profile] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.dialect import SQLiteDialect
from runtime.coordinator.service import Coordinator


def messages(devices: int, fleet_name: str = "bench") -> list[tuple[str, bytes, float]]:
    """A health and a one-result batch per device, as the simulator sends them."""
    now = time.time()
    out = []
    for i in range(devices):
        dev = f"p{i:05d}"
        out.append((f"edgerun/v1/{fleet_name}/{dev}/health", json.dumps(
            {"v": 1, "t": now, "boot": "b", "uptime_s": 10.0, "temp_c": 50.0, "rung": 0,
             "rungs": 3, "choice": "sim", "mqtt": {"connected": True, "acked_seq": 0},
             "backlog": {"results_held": 1, "bytes": 100, "oldest_seq": 1,
                         "evicted_total": 0}}).encode(), now))
        out.append((f"edgerun/v1/{fleet_name}/{dev}/result", json.dumps(
            {"v": 1, "stream": "s", "boot": "b", "floor": 1, "results": [
                {"seq": 1, "t": now, "label": "ok", "score": 0.9}]}).encode(), now))
    return out


def births(devices: int, fleet_name: str = "bench") -> list[tuple[str, bytes, float]]:
    """Every device's retained birth, as the simulator publishes it."""
    now = time.time()
    return [(f"edgerun/v1/{fleet_name}/p{i:05d}/state", json.dumps(
        {"v": 1, "online": True, "boot": f"b{i}", "t": now, "stream": "s",
         "versions": {"edgerun": "fleetsim"}}).encode(), now) for i in range(devices)]


def run(store: str, raws: list, profile: bool, top: int, share_group: str = "",
        per_birth: bool = False) -> float:
    """CPU seconds per 1,000 messages through _ingest (+ refresh once per 2,000 messages).
    `per_birth`: the path before the birth burst was batched (the module's docstring)."""
    coord = Coordinator(CoordinatorConfig(fleet="bench", store=store, share_group=share_group))
    coord._conn.publish = lambda *a, **k: None  # no broker: acks are encoded, not sent
    if per_birth:
        many = coord.rollouts.on_online_many
        coord.rollouts.on_online_many = lambda bs: [many([b]) for b in bs]  # type: ignore
        d = coord.store._d  # the portable statements (what PostgreSQL ran before as well)
        d.upsert_states = types.MethodType(SQLiteDialect.upsert_states, d)  # type: ignore
        d.in_list = types.MethodType(SQLiteDialect.in_list, d)  # type: ignore
    batch = coord.cfg.ingest_batch
    prof = cProfile.Profile() if profile else None
    gc.collect()  # the garbage of an earlier run is not this one's cost
    t0 = time.process_time()
    if prof:
        prof.enable()
    for i in range(0, len(raws), batch):
        coord._ingest(raws[i:i + batch])
        if (i // batch) % max(1, 2000 // batch) == 0:
            coord._refresh(time.time())
    if prof:
        prof.disable()
    took = time.process_time() - t0
    coord.store.close()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    return took / len(raws) * 1000


def main() -> None:
    """Run and print CPU per 1,000 messages per backend."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--backends", default="sqlite")
    ap.add_argument("--births", action="store_true",
                    help="a start's retained births (share_group set), per-birth vs batched")
    ap.add_argument("--repeat", type=int, default=3, help="--births: runs of each, least kept")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    raws = births(a.devices) if a.births else messages(a.devices)
    with tempfile.TemporaryDirectory() as d:
        pg = None
        try:
            for backend in a.backends.split(","):
                if backend == "postgresql":
                    from runtime.coordinator.pgserver import TempPostgres

                    pg = pg or TempPostgres({"fsync": "on", "synchronous_commit": "off"}
                                            ).start()
                    store = pg.create_database("ingest_profile")
                else:
                    store = str(Path(d) / "p.db")
                if a.births:
                    best = {True: float("inf"), False: float("inf")}
                    for k in range(a.repeat):  # alternated, the least of each: a shared
                        # machine's load only adds; which goes first alternates too
                        for per_birth in ((True, False) if k % 2 == 0 else (False, True)):
                            # a fresh database each: an earlier run's claims would win nothing
                            store = (pg.create_database(f"births{k}{per_birth:d}") if pg
                                     else str(Path(d) / f"b{k}{per_birth:d}.db"))
                            best[per_birth] = min(best[per_birth], run(
                                store, raws, a.profile, a.top, "bench", per_birth))
                    line = [f"{'before' if per_birth else 'after'} {per_1k * 1000:.0f} µs/birth "
                            f"({per_1k * len(raws) / 1000:.2f} s for {len(raws)})"
                            for per_birth, per_1k in best.items()]
                    print(f"{backend}: births of {a.devices} devices, coordinator ingest CPU "
                          f"(least of {a.repeat}): "
                          + "; ".join(line), flush=True)
                    continue
                per_1k = run(store, raws, a.profile, a.top)
                print(f"{backend}: {len(raws)} messages of {a.devices} devices, coordinator "
                      f"ingest CPU {per_1k * 1000:.0f} µs/message ({per_1k:.3f} s per 1,000)",
                      flush=True)
        finally:
            if pg is not None:
                pg.stop()


if __name__ == "__main__":
    main()
