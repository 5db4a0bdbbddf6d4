"""A coordinator whose wall clock jumps (forward 7 days, back an hour, from 1970): retention
never deletes data early, nor freezes when it steps back."""

from __future__ import annotations

import time

import pytest
from support.stepped_clock import Clocks

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.store import Inbound
from runtime.wire.clock import SteadyWall

DAY = 86400.0


@pytest.mark.parametrize("moves, want", [
    ([("run", 60)], 60),  # in step: the wall clock
    ([("step", 7 * DAY)], 0),  # 7 days ahead: held to what monotonic counted
    ([("step", 7 * DAY), ("run", 3600)], 3600),
    ([("step", -3600)], -3600),  # back an hour: followed (data kept longer)
    ([("step", -3600), ("run", 60)], -3540),  # and runs on from there, not frozen
    ([("step", 40.0)], 40.0),  # a slew-sized correction inside the slack: followed
])
def test_steady_wall(moves, want):
    c = Clocks(1_790_000_000.0)
    sw = SteadyWall(lambda: c.w, lambda: c.m)
    for how, s in moves:
        getattr(c, how)(s)
    assert sw.now() - 1_790_000_000.0 == pytest.approx(want)


def test_steady_wall_from_1970_counts_one_jump_and_returns_in_step(caplog):
    c = Clocks(0.0)  # a coordinator host that booted at 1970
    sw = SteadyWall(lambda: c.w, lambda: c.m)
    c.step(1_790_000_000.0)  # NTP: 56 years forward
    assert sw.now() == pytest.approx(0.0) and sw.now() == pytest.approx(0.0)
    assert sw.jumps_total == 1 and caplog.text.count("ahead of what the monotonic") == 1


def _results(n: int) -> Inbound:
    return Inbound("d1", "result", {"v": 1, "stream": "s1", "boot": "b", "floor": 1,
                                    "results": [{"seq": q, "t": time.time(), "label": "ok"}
                                                for q in range(1, n + 1)]})


def test_retention_keeps_a_week_when_the_clock_jumps_forward(tmp_path):
    """Results received now, kept 7 days: a wall clock that jumps 8 days ahead deletes none
    of them (the same pass on the jumped wall time deletes them all: the test can fail)."""
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "s.db"),
                                      bundles_dir=str(tmp_path / "none"), retention_days=7))
    try:
        c.store.ingest([_results(20)])
        clocks = Clocks(time.time())
        c.retention.clock = SteadyWall(lambda: clocks.w, lambda: clocks.m)
        clocks.step(8 * DAY)
        c.retention.run()
        assert c.store.counts() == {"d1": 20}
        clocks.run(3600)  # an hour later, still nothing is a week old
        c.retention.run()
        assert c.store.counts() == {"d1": 20}
        # the same pass judged by the jumped wall clock: all 20 would go
        c.store.prune_results(7 * DAY, now=clocks.w)
        assert not c.store.counts()
    finally:
        c.store.close()
        c.shelf.close()


def test_a_reboot_a_week_behind_is_the_devices_new_state():
    """A box rebooting without an RTC battery births a week in the past: it is its new boot,
    not a late state of an old one; a late will of the old boot (both synced, older) is not."""
    from runtime.coordinator import fleet

    now = 1_790_000_000.0
    v = fleet.on_state(fleet.DeviceView("d"), {"v": 1, "online": True, "boot": "b1", "t": now,
                                               "clk": {"sync": True, "kb": "k1", "bt": 50.0}},
                       now)
    birth = {"v": 1, "online": True, "boot": "b2", "t": now - 7 * DAY,
             "clk": {"sync": False, "kb": "k2", "bt": 3.0}}
    v = fleet.on_state(v, birth, now + 60)
    assert v.boot == "b2" and v.online
    synced = fleet.on_state(v, {**birth, "t": now + 90, "clk": {"sync": True, "kb": "k2",
                                                                 "bt": 33.0}}, now + 90)
    late_will = {"v": 1, "online": False, "boot": "b1", "t": now - 1,
                 "clk": {"sync": True, "kb": "k1", "bt": 49.0}}
    assert fleet.on_state(synced, late_will, now + 91).boot == "b2"
    # devices of older versions (no stamps): by wall time, as before
    old = fleet.on_state(fleet.DeviceView("d"), {"v": 1, "online": True, "boot": "b1",
                                                 "t": now}, now)
    assert fleet.on_state(old, {"v": 1, "online": False, "boot": "b0", "t": now - 5},
                          now).boot == "b1"


def test_coalesced_health_is_not_held_for_an_hour_when_the_clock_steps_back(tmp_path,
                                                                             monkeypatch):
    """A health held back by the coalescer is stored at its window's end by the monotonic
    clock: a coordinator wall clock stepped back an hour does not hold it for that hour."""
    import json
    from types import SimpleNamespace

    from runtime.coordinator import admission as admission_mod
    from runtime.coordinator import service as service_mod
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "s.db"),
                                      bundles_dir=str(tmp_path / "none"), coalesce_s=1.0))
    clocks = Clocks(1_790_000_000.0)
    fake_time = SimpleNamespace(time=lambda: clocks.w, monotonic=lambda: clocks.m,
                                sleep=time.sleep)
    for mod in (service_mod, admission_mod):  # the ingest loop's clocks and the coalescers'
        monkeypatch.setattr(mod, "time", fake_time)
    topic = "edgerun/v1/f/d1/health"

    def health(t: float) -> tuple[str, bytes, float]:
        return topic, json.dumps({"v": 1, "t": t, "boot": "b"}).encode(), clocks.w

    try:
        t0 = 1_790_000_000.25  # the device's clock: both in one coalesce window
        c._ingest([health(t0)])
        clocks.run(0.1)
        c._ingest([health(t0 + 0.1)])  # held: the window is still open
        assert len(c.store.read("SELECT t FROM health")) == 1
        clocks.step(-3600)  # the coordinator's clock steps back an hour
        clocks.run(1.5)  # and the window ends by the monotonic clock
        c._ingest([])
        assert sorted(t for (t,) in c.store.read("SELECT t FROM health")) == \
            pytest.approx([t0, t0 + 0.1])
    finally:
        c.store.close()
        c.shelf.close()
