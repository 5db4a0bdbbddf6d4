"""The coordinator's group commit, sized for the disk: when the ingest window ends
(WindowCount, pure), and a device's `devices` row rewritten only when its view changed
beyond `last_seen` (or `last_seen` moved far enough), on both backends."""

from __future__ import annotations

import json
import time

import pytest

from runtime.coordinator import fleet
from runtime.coordinator.ingest import view_changed
from runtime.coordinator.ingest_window import WindowCount, results_in, window_s
from runtime.coordinator.store import Inbound, Store

T = "edgerun/v1/f1"


def _raw_results(n: int, first: int = 1) -> bytes:
    return json.dumps({"v": 1, "stream": "s", "boot": "b", "floor": first,
                       "results": [{"seq": s, "t": 1.0} for s in range(first, first + n)]},
                      separators=(",", ":")).encode()


@pytest.mark.parametrize("raw,n", [(_raw_results(1), 1), (_raw_results(50), 50),
                                   (b"{}", 1), (b'{"seq":1,"seq":2}', 2)])
def test_results_in_counts_the_seqs_of_a_message(raw, n):
    assert results_in(raw) == n


# (messages in order as (topic kind, device, results), cap) -> the index that ends it or None
@pytest.mark.parametrize("msgs,cap,ends_at", [
    ([("result", "a", 10), ("result", "a", 10), ("result", "a", 5)], 25, 2),
    ([("result", "a", 10), ("result", "b", 10), ("result", "a", 10)], 25, None),  # per device
    ([("result", "a", 30)], 25, 0),  # one backlog batch past the cap
    ([("result", "a", 30)], 0, None),  # 0: no early end
    ([("health", "a", 0), ("event", "a", 0), ("result", "a", 1)], 25, None),
    ([("health", "a", 0)] * 3 + [("event", "a", 0)] * 3, 2, None),  # not counted as results
    ([("result", "a", 1), ("state", "a", 0)], 25, 1),  # a birth: its desired state awaits
    ([("cmd/reply", "a", 0)], 25, 0),  # a command's issuer waits on the reply
    ([("not/a/topic", "", 0)], 25, None),  # quarantined; nobody waits on it
])
def test_window_ends_near_a_devices_cap_and_for_what_is_awaited(msgs, cap, ends_at):
    count = WindowCount(cap)
    ended = None
    for i, (kind, device, n) in enumerate(msgs):
        topic = f"{T}/{device}/{kind}" if device else kind
        if count.add(topic, _raw_results(n) if kind == "result" else b"{}"):
            ended = i
            break
    assert ended == ends_at


@pytest.mark.parametrize("configured,stale,used", [
    (2.0, 30.0, 2.0),  # the defaults: as configured
    (2.0, 2.0, 0.25),  # a 2 s stale_after_s: an eighth of it
    (0.0, 2.0, 0.0),  # 0: at once, whatever stale_after_s
    (10.0, 80.0, 10.0),
    (10.0, 79.0, 79.0 / 8),
])
def test_window_stays_an_eighth_of_stale_after_s(configured, stale, used):
    assert window_s(configured, stale) == pytest.approx(used)


def test_the_coordinator_uses_the_bounded_window(tmp_path):
    """A coordinator whose stale_after_s is 2 s groups its commits over 0.25 s, not the
    configured 2 s (which called a device talking twice a second stale between windows)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    for stale, used in ((2.0, 0.25), (30.0, 2.0)):
        coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / f"{stale}.db"),
                                              stale_after_s=stale, offline_after_s=120.0,
                                              ingest_window_s=2.0))
        try:
            assert coord.ingest_window_s == pytest.approx(used)
        finally:
            coord.store.close()


def _v(**kw) -> fleet.DeviceView:
    return fleet.DeviceView(**{"device": "d1", "online": True, "status": "online",
                               "last_seen": 100.0, **kw})


@pytest.mark.parametrize("old,new,every,changed", [
    (None, _v(), 5.0, True),  # no row yet
    (_v(), _v(), 5.0, False),
    (_v(), fleet.on_activity(_v(), 104.0), 5.0, False),  # last_seen alone, 4 s
    (_v(), fleet.on_activity(_v(), 105.0), 5.0, True),  # ... 5 s: due
    (_v(), fleet.on_activity(_v(), 100.5), 0.0, True),  # 0: every move
    (_v(), fleet.on_activity(_v(), 101.0, {"t": 1.0}), 5.0, True),  # a health
    (_v(), _v(status="stale"), 5.0, True),
    (_v(), _v(boot="b2"), 5.0, True),
])
def test_view_row_written_only_on_change(old, new, every, changed):
    assert view_changed(old, new, every) is changed


def _updated(store: Store, device: str) -> float:
    with store._d.transaction() as db:
        return float(db.execute("SELECT updated FROM devices WHERE device = ?",
                                (device,)).fetchone()[0])


def _result(seq: int) -> Inbound:
    return Inbound("d1", "result", {"v": 1, "stream": "s1", "boot": "b", "floor": 1,
                                    "results": [{"seq": seq, "t": time.time()}]}, 0)


def test_results_alone_do_not_rewrite_the_view_row_until_last_seen_is_due(store_url):
    """Results within `last_seen_write_s` leave the `devices` row as it was (the merged view
    still goes to the caller with the row's stamp, its `last_seen` the newest); a health,
    or `last_seen` due, writes it; every result is stored and acked either way."""
    store = Store(store_url)
    store.last_seen_write_s = 3600.0
    written: dict = {}
    acks, refused = store.ingest([_result(1)], written)
    assert not refused and acks[("d1", "s1")][0].seq == 1
    first = _updated(store, "d1")
    assert written["d1"][0] == first
    seen = written["d1"][1].last_seen
    time.sleep(0.01)
    acks, _ = store.ingest([_result(2)], written)
    assert acks[("d1", "s1")][0].seq == 2
    assert _updated(store, "d1") == first  # not rewritten
    assert written["d1"][0] == first and written["d1"][1].last_seen > seen
    store.ingest([Inbound("d1", "health", {"v": 1, "t": time.time(), "boot": "b"}, 0)],
                 written)
    assert _updated(store, "d1") > first  # a health changes the view: written
    second = _updated(store, "d1")
    store.last_seen_write_s = 0.0
    time.sleep(0.01)
    store.ingest([_result(3)], written)
    assert _updated(store, "d1") > second  # last_seen due: written
    assert store.counts()["d1"] == 3 and store.result_seqs("d1") == [("s1", 1), ("s1", 2),
                                                                      ("s1", 3)]
