"""Issue 36, findings 1 and 2, as the attack run saw them: with `max_store_mb = 8`, device A
publishes results (never acked), health and events as fast as it can while B and C publish at
a normal rate. Every row B and C sent stays, and the store stays within max_store_mb plus one
batch at every measurement of the flood (on 2cc5603: B's health fell 667 -> 371 and the store
grew 18.6 -> 25.2 MB over the 8 MB cap).

Driven through the real ingest (Store.ingest, batch by batch as the coordinator's ingest loop
makes them) and the real retention pass (retention.Retention.run), on both backends. The
clock is simulated: one batch a step, and retention runs when a batch found the store over
its budget no more often than every WAKE steps (the coordinator's `retention_wake_s`), plus
every INTERVAL steps: what a flood gets between passes is what finding 2 was about."""

from __future__ import annotations

import collections
import json
import threading

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.bundles import Shelf
from runtime.coordinator.retention import Retention
from runtime.coordinator.store import Inbound, Store

CAP_MB = 8
STEPS = 90
WAKE = 5  # steps between retention passes woken by a full store (retention_wake_s)
INTERVAL = 30  # steps between scheduled passes (retention_interval_s)
T0 = 1_900_000_000.0  # the devices' clocks (health and event stamps)


def _health(t: float, pad: int) -> dict:
    return {"v": 1, "t": t, "boot": "b1", "temp_c": 41.5, "rung": 2, "rungs": 4,
            "pipeline": {"rate_hz": 10.0, "latency_ms": {"p95": 12.5}},
            "note": "h" * pad}


def _event(t: float, kind: str, pad: int) -> dict:
    return {"v": 1, "t": t, "type": kind, "detail": "e" * pad}


def _results(stream: str, first: int, n: int, floor: int, t: float, pad: int) -> dict:
    return {"v": 1, "stream": stream, "boot": "b1", "floor": floor,
            "results": [{"seq": s, "t": t, "label": "cat", "score": 0.9, "x": "r" * pad}
                        for s in range(first, first + n)]}


def _normal(device: str, step: int) -> list[Inbound]:
    """What a well-behaved device sends in one step: a health, a result message (its floor
    is its first result: acked by this batch), an event now and then."""
    t = T0 + step
    out = [Inbound(device, "health", _health(t, 400)),
           Inbound(device, "result", _results("s1", step * 5 + 1, 5, step * 5 + 1, t, 150))]
    if step % 4 == 0:
        out.append(Inbound(device, "event", _event(t, "rung_change", 100)))
    return out


def _flood(step: int) -> list[Inbound]:
    """What A sends in one step, as fast as it can: results above a floor it never sends
    (never acked), health with distinct stamps (no coalescing), events."""
    t = T0 + step
    return [Inbound("A", "result", _results("s1", 2 + step * 150, 150, 1, t, 500)),
            *(Inbound("A", "health", _health(t + i / 40, 2500)) for i in range(40)),
            *(Inbound("A", "event", _event(t + i / 10, "flood", 1500)) for i in range(10))]


def _kept(store: Store, device: str) -> tuple[list, list, list]:
    """Everything the store keeps of a device: result keys, health stamps, event stamps."""
    health = [t for (t,) in store.read("SELECT t FROM health WHERE device=? ORDER BY t",
                                       (device,))]
    events = [t for (t,) in store.read("SELECT t FROM events WHERE device=? ORDER BY t",
                                       (device,))]
    return store.result_seqs(device), health, events


def _size(store: Store) -> int:
    """The store's size as the store measures it against max_store_mb."""
    return getattr(store, "size_bytes", store.used_bytes)()


def test_one_device_flooding_keeps_every_other_devices_rows_and_the_store_its_cap(
        store_url, tmp_path):
    cfg = CoordinatorConfig(fleet="f", store=store_url, max_store_mb=CAP_MB)
    store = Store(store_url, cfg.fsync, cfg.store_margin)
    shelf = Shelf(store, 64 << 20)
    counters: collections.Counter = collections.Counter()
    retention = Retention(cfg, store, shelf, counters, threading.Event())
    cap = CAP_MB * 2**20
    # B and C: an hour of history before the flood
    for step in range(-120, 0):
        store.ingest([*_normal("B", step), *_normal("C", step)])
    retention.set_cap()
    retention.run()
    sent = {d: _kept(store, d) for d in ("B", "C")}
    sizes, growth, last_pass, refused = [], [], 0, 0
    for step in range(STEPS):
        before = _size(store)
        batch = [*_flood(step), *_normal("B", step), *_normal("C", step)]
        _, bad = store.ingest(batch)
        refused += len(bad)
        sizes.append(_size(store))
        growth.append(sizes[-1] - before)
        for d in ("B", "C"):  # every row B and C sent is stored (and nothing they sent went)
            got = _kept(store, d)
            new = [m for m in batch if m.device == d]
            for i, kind in enumerate(("result", "health", "event")):
                want = len(sent[d][i]) + sum(
                    len(m.msg["results"]) if kind == "result" else 1
                    for m in new if m.kind == kind)
                assert len(got[i]) == want, (step, d, kind, len(got[i]), want)
            sent[d] = got
        if (store.over_budget and step - last_pass >= WAKE) or step - last_pass >= INTERVAL:
            retention.run()
            last_pass = step
            sizes.append(_size(store))
    one_batch = max(growth)
    worst = max(sizes)
    assert worst <= cap + one_batch, (
        f"the store reached {worst / 2**20:.2f} MB against max_store_mb = {CAP_MB} plus one "
        f"batch ({one_batch / 2**20:.2f} MB)")
    gone = {k: n for k, n in counters.items() if k.startswith(("shed", "pruned"))}
    print(f"[{store.backend}] max {worst / 2**20:.2f} MB against {CAP_MB} MB + one batch "
          f"{one_batch / 2**20:.2f} MB; A refused {refused}, shed/pruned {gone}, "
          f"B {len(sent['B'][1])} health kept")
    # the flood was a flood: A's rows went somewhere other than the store
    flood_bytes = sum(len(json.dumps(m.msg)) for m in _flood(0)) * STEPS
    assert flood_bytes > 2 * cap
    store.close()
