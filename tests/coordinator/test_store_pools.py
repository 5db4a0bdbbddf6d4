"""A compromised device costs only itself (issue 36, findings 1 and 2), on both backends: one
device flooding the store leaves every other device's results, health and events untouched,
and the store's logical bytes within its budget plus one batch, batch after batch."""

from __future__ import annotations

import json
import time
from collections import Counter

from runtime.coordinator import quotas
from runtime.coordinator.store import Inbound, Store


def _results(stream: str, seqs, floor: int, blob: int = 0) -> dict:
    return {"v": 1, "stream": stream, "boot": "b1", "floor": floor,
            "results": [{"seq": s, "t": time.time(), "label": "x" * blob} for s in seqs]}


def _health(t: float, pad: int = 0) -> dict:
    return {"v": 1, "t": t, "boot": "b1", "temp_c": 40.0, **({"note": "y" * pad} if pad else {})}


def _rows(store: Store, device: str) -> tuple:
    """Everything the store keeps of a device: its result keys, health stamps, events."""
    health = [t for (t,) in store.read("SELECT t FROM health WHERE device=? ORDER BY t",
                                       (device,))]
    points = store.read("SELECT COUNT(*) FROM health_points WHERE device=?", (device,))
    return (store.result_seqs(device), health, points, store.events(device, 10_000))


def test_one_device_flooding_costs_only_itself_and_the_store_keeps_its_cap(store_url):
    store = Store(store_url, margin=0.0)
    now = time.time()
    # B and C: acked results, a health history, events; what the flood must not touch
    for dev in ("B", "C"):
        for k in range(5):
            store.ingest([Inbound(dev, "result", _results("s", range(k * 40 + 1, k * 40 + 41),
                                                          k * 40 + 1, blob=100)),
                          Inbound(dev, "health", _health(now - 3600 + k)),
                          Inbound(dev, "event", {"v": 1, "t": now - 3600 + k, "type": "x"})])
    kept = {d: _rows(store, d) for d in ("B", "C")}
    held = sum(store.usage().values())
    cap = store.used_bytes() + 4 * held  # a cap the flood goes far past
    budget = store.set_cap(cap)
    assert budget > held
    # A: results whose floor is never stored (never acked), and health, as fast as it can;
    # each batch as the coordinator makes it, retention after each (its wake)
    seq, worst, refused = 2, 0, 0
    for k in range(40):
        budget = store.budget_bytes  # in force for this batch (each pass re-measures)
        batch = [Inbound("A", "result", _results("s", range(seq, seq + 200), 1, blob=300)),
                 Inbound("A", "health", _health(now - 7200 + k, pad=2000)),
                 Inbound("A", "event", {"v": 1, "t": now - 7200 + k, "type": "flood"})]
        seq += 200
        _, bad = store.ingest(batch)
        refused += len(bad)
        one_batch = sum(quotas.message_bytes(m.device, m.kind, m.msg, len(json.dumps(m.msg)))
                        for m in batch)
        worst = max(worst, sum(store.usage().values()) - budget - one_batch)
        store.prune_results(max_bytes=cap, chunk=500)
        # a device within its share is never touched, whatever the flood
        for d in ("B", "C"):
            assert _rows(store, d) == kept[d], (k, d)
    assert refused > 0
    assert worst <= 0, f"the store went {worst} bytes past its budget plus one batch"
    store.close()


def test_a_health_flood_never_takes_another_devices_rows_when_the_overhead_moves(store_url):
    """The shares are logical bytes; the file's bytes per logical byte (measured) moves with
    the mix of rows. A floods small healths (a timeline row and two index entries each, far
    more per logical byte than B's results): the store went over its cap with no device
    over its share, and the size cap then took the oldest rows of every device (issue 36:
    every device's health history fell while A flooded). Now the overhead is measured again
    and what goes is A's. On PostgreSQL the ratio kept is the lowest measured (its files do
    not shrink by row deletes: measured again they collapsed the budget)."""
    store = Store(store_url, margin=0.0)
    now = time.time()
    for dev in ("B", "C"):
        store.ingest([Inbound(dev, "result", _results("s", range(1, 201), 1, blob=400)),
                      *(Inbound(dev, "health", _health(now - 3600 + k)) for k in range(20)),
                      Inbound(dev, "event", {"v": 1, "t": now - 3600, "type": "x"})])
    kept = {d: _rows(store, d) for d in ("B", "C")}
    cap = store.used_bytes() + sum(store.usage().values())
    store.set_cap(cap)
    for k in range(60):
        store.ingest([Inbound("A", "health", _health(now - 7200 + k * 100 + i))
                      for i in range(100)])
        store.prune_results(max_bytes=cap, chunk=500)
        for d in ("B", "C"):
            assert _rows(store, d) == kept[d], (k, d)
    assert store.used_bytes() <= cap or store.backend != "sqlite"
    store.close()


def test_rows_shed_are_told_once_even_after_the_cap_is_lifted(store_url):
    """Retention is told the rows admission shed once (take_shed): with the cap lifted after
    a batch that shed rows, every later batch told that batch's count again."""
    store = Store(store_url, margin=0.0)
    store.ingest([Inbound("B", "result", _results("s", range(1, 201), 1, blob=400))])
    store.set_cap(store.used_bytes() + sum(store.usage().values()))
    shed: Counter = Counter()
    now = time.time()
    for k in range(60):  # A floods health until it sheds its own oldest
        store.ingest([Inbound("A", "health", _health(now - 7200 + k * 100 + i, pad=500))
                      for i in range(100)])
        shed.update(store.take_shed())
        if +shed:
            break
    assert set(+shed) == {("A", "health")}, shed
    store.set_cap(0)  # no cap: nothing is shed
    for k in range(3):
        store.ingest([Inbound("B", "health", _health(time.time() + k))])
    assert +store.take_shed() == Counter()
    store.close()
