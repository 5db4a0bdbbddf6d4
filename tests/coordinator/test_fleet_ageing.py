"""The coordinator's fleet refresh ages only the devices that are due (runtime/coordinator/
ageing.py): touched since the last refresh, or past their silence threshold
(fleet.next_change). It must give exactly what a refresh of every device gives
(fleet.refresh), at a cost that follows the devices changing; and a refresh's alert
transitions are claimed in one store transaction when coordinators share a store."""

from __future__ import annotations

import random
import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound

T0 = 1_700_000_000.0


def _birth(t: float, version: str = "1.0", boot: str = "b1") -> dict:
    return {"v": 1, "online": True, "boot": boot, "t": t, "versions": {"edgerun": version}}


def _coordinator(tmp_path, name: str = "c", **kw) -> Coordinator:
    return Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                         client_id=name, stale_after_s=30,
                                         offline_after_s=120, wake_margin_s=300, **kw))


def _full(c: Coordinator, now: float) -> dict[str, fleet.DeviceView]:
    return fleet.refresh(c.views, now, c.fleet_cfg)


def test_incremental_refresh_equals_a_full_one_through_a_fleets_life(tmp_path):
    """400 devices (online, sleepers, dead ones; two versions) through 80 refreshes with
    random messages between them, the majority version flipping half-way: after every
    refresh each view equals what ageing every device gives, yet quiet refreshes recompute
    nothing."""
    rnd = random.Random(16)
    c = _coordinator(tmp_path)
    try:
        views = {}
        for i in range(400):
            d = f"d{i:03d}"
            v = fleet.on_state(fleet.DeviceView(d), _birth(T0, "1.0" if i < 250 else "0.9"),
                               T0 - rnd.uniform(0, 100))
            if i % 8 == 0:  # a sleeper, waking at various times
                v = fleet.on_state(v, {"v": 1, "online": False, "boot": "b1", "t": T0,
                                       "asleep": True, "wake_at": T0 + rnd.uniform(0, 400)}, T0)
            elif i % 13 == 0:
                v = fleet.on_state(v, {"v": 1, "online": False, "boot": "b1", "t": T0}, T0)
            views[d] = v
        c.views = views
        now, quiet_runs = T0, 0
        for step in range(80):
            if step == 40:  # 200 devices come back on 0.9: the majority flips to 0.9
                with c._views_lock:
                    for i in range(200):
                        c._update_view(Inbound(f"d{i:03d}", "state", _birth(now, "0.9", "b2")),
                                       now)
            elif step % 3 == 0:
                with c._views_lock:
                    for d in rnd.sample(sorted(views), 15):
                        c._update_view(Inbound(d, "health", {"v": 1, "t": now, "boot": "b1",
                                                             "temp_c": rnd.choice([40, 84]),
                                                             "passive_trip_c": 85.0}), now)
            now += rnd.uniform(0.5, 9)
            n0 = c.counters["views_recomputed"]
            c._refresh(now)
            assert c.views == _full(c, now), f"step {step}"
            n1 = c.counters["views_recomputed"]
            c._refresh(now + 0.01)  # nothing touched, nothing crossed a threshold
            assert c.counters["views_recomputed"] == n1, f"step {step}"
            quiet_runs += n1 - n0 < 400
        assert quiet_runs >= 70  # most refreshes recomputed part of the fleet only
        assert c._fleet_version == "0.9"
        assert {code for v in c.views.values() for code, _ in v.alerts} >= {
            "version", "stale", "offline", "missed_wake", "hot"}
    finally:
        c.store.close()


def test_a_quiet_fleet_of_10000_costs_a_refresh_nothing(tmp_path):
    """Ageing all 10,000 views every second was the coordinator's largest cost at that
    scale: now a second with no message recomputes no view, and the fleet going stale at
    once recomputes each view once."""
    c = _coordinator(tmp_path)
    try:
        c.views = {f"d{i:05d}": fleet.on_state(fleet.DeviceView(f"d{i:05d}"), _birth(T0), T0)
                   for i in range(10_000)}
        c._refresh(T0 + 1)
        assert c.counters["views_recomputed"] == 10_000  # replaced whole: all due once
        t = time.process_time()
        for k in range(2, 30):
            c._refresh(T0 + k)
        quiet_cpu = time.process_time() - t
        assert c.counters["views_recomputed"] == 10_000
        with c._views_lock:
            c._update_view(Inbound("d00042", "health", {"v": 1, "t": T0 + 30, "boot": "b1"}),
                           T0 + 30)
        c._refresh(T0 + 31)  # every device but d00042 goes stale
        assert c.counters["views_recomputed"] == 20_000
        assert sum(v.status == "stale" for v in c.views.values()) == 9_999
        assert c.views["d00042"].status == "online"
        assert quiet_cpu < 2.0, quiet_cpu  # 28 refreshes; about 1 ms each when quiet
    finally:
        c.store.close()


def test_a_refresh_claims_its_alert_transitions_in_one_transaction(tmp_path):
    """With share_group, 300 devices going stale at once were 300 claim transactions under
    the views lock; now one claim_many for all. A second coordinator on the same store
    computing the same transitions sends none of them (exactly once across both)."""
    coords = [_coordinator(tmp_path, f"c{k}", share_group="g",
                           webhook_url="http://127.0.0.1:9/hook") for k in (0, 1)]
    calls: list[tuple[str, int]] = []
    try:
        for c in coords:
            real_many, real_one = c.store.claim_many, c.store.claim

            def many(items, *a, _real=real_many, **kw):
                calls.append(("claim_many", len(items)))
                return _real(items, *a, **kw)

            def one(*a, _real=real_one, **kw):
                calls.append(("claim", 1))
                return _real(*a, **kw)

            c.store.claim_many, c.store.claim = many, one
            c.views = {f"d{i:03d}": fleet.on_state(fleet.DeviceView(f"d{i:03d}"), _birth(T0),
                                                   T0) for i in range(300)}
            c._refresh(T0 + 1)
        assert calls == []  # nothing raised yet
        for c in coords:
            c._refresh(T0 + 31)
        assert calls == [("claim_many", 300), ("claim_many", 300)]
        assert [c.webhook.stats()["queue"] for c in coords] == [300, 0]
        assert [c.counters["alerts_raised"] for c in coords] == [300, 300]  # both computed
    finally:
        for c in coords:
            c.store.close()


def test_stats_give_the_health_age_of_the_last_seconds_apart(tmp_path):
    """`health_age_recent_s` leaves a start's backlog (ages taken more than RECENT_S ago)
    out, so a bench's steady state is not the births' queue."""
    from runtime.coordinator import service

    c = _coordinator(tmp_path)
    try:
        now = time.time()
        with c._views_lock:  # a backlog taken 60 s ago: 30 s old health
            c.health_ages.ages.extend([30.0] * 100)
            c.health_ages.taken.extend([now - 60] * 100)
        c._ingest([("edgerun/v1/f/d1/health", b'{"v":1,"t":%f,"boot":"b"}' % (now - 0.5),
                    now)])
        st = c.stats()
        assert st["health_age_s"]["n"] == 101 and st["health_age_s"]["p50"] == 30.0
        recent = st["health_age_recent_s"]
        assert recent["n"] == 1 and 0.4 < recent["p50"] < 5
        assert recent["window_s"] == service.RECENT_S
    finally:
        c.store.close()
