"""A coordinator whose wall clock steps (forward 7 days, back an hour, from 1970 to now): a
device's silence and the alerts' delays are elapsed time, so no device is aged stale or
offline by a step forward (every device at once: a page storm on the webhook), nor kept
online an hour by a step back; no alert's raise or clear delay fires early or freezes.

The coordinator runs as it does (its ingest, its refresh through the API's entry points,
its store) with the wall and monotonic clocks of its modules replaced by ones the test
moves (`Clocks`: `run` moves both, `step` the wall alone, as an NTP step does)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from support.stepped_clock import Clocks

from runtime.config.coordinator import CoordinatorConfig
from runtime.wire import payloads

DAY = 86400.0
NOW = 1_790_000_000.0  # 2026-09-21
BOOT_1970 = 100_000.0  # a coordinator host without an RTC battery, booted at 1970


@pytest.fixture
def coordinator(tmp_path, monkeypatch):
    """make(wall) -> (Coordinator, Clocks): a coordinator whose modules read the test's
    clocks (stale 30 s, offline 120 s, alert_clear_s 30, offline_alert_s 60)."""
    from runtime.coordinator import admission, alerting, ingest, service

    made = []

    def make(wall: float):
        clocks = Clocks(wall)
        fake = SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                  if not k.startswith("_")})
        fake.time, fake.monotonic = (lambda: clocks.w), (lambda: clocks.m)
        for mod in (service, ingest, admission, alerting):
            monkeypatch.setattr(mod, "time", fake)
        c = service.Coordinator(CoordinatorConfig(
            fleet="f", store=str(tmp_path / f"c{len(made)}.db"),
            bundles_dir=str(tmp_path / "none"), stale_after_s=30, offline_after_s=120,
            alert_clear_s=30, offline_alert_s=60, coalesce_s=0))
        c.mono = lambda: clocks.m
        made.append(c)
        return c, clocks

    yield make
    for c in made:
        c.store.close()
        c.shelf.close()


def talk(c, clocks: Clocks, *devices: str, online: bool = True) -> None:
    """A health from each device (or a will: `online` False), stamped by its own clock,
    which reads what the coordinator's does, received now."""
    if online:
        batch = [(payloads.topic("f", d, "health"), payloads.encode("health", {
            "v": 1, "t": clocks.w, "boot": "b"}), clocks.w) for d in devices]
    else:
        batch = [(payloads.topic("f", d, "state"), payloads.encode("state", {
            "v": 1, "online": False, "boot": "b", "t": clocks.w}), clocks.w)
            for d in devices]
    c._ingest(batch)


def statuses(c) -> dict[str, str]:
    """Every device's status, by the API's own refresh."""
    return {v["device"]: v["status"] for v in c.fleet_view()}


def told(c) -> list[tuple[str, str, str]]:
    """The alert transitions told since the last call (device, alert, raised|cleared)."""
    out = [(b["device"], b["alert"], b["state"]) for b in c.alert_log]
    c.alert_log.clear()
    return out


@pytest.mark.parametrize("start, step", [
    (NOW, 7 * DAY),  # a bad time server, or a host that was a week behind
    (BOOT_1970, NOW - BOOT_1970),  # a host without an RTC battery: 1970, then NTP
])
def test_a_step_forward_ages_no_device(coordinator, start, step):
    """Old code: every device stale at the refresh after the step (stale raised for each:
    one page a device), then offline, and cleared at each one's next message."""
    from runtime.coordinator import coord_stats

    c, clocks = coordinator(start)
    talk(c, clocks, "d1", "d2", "d3")
    assert statuses(c) == {"d1": "online", "d2": "online", "d3": "online"}
    clocks.run(5)
    clocks.step(step)
    assert statuses(c) == {"d1": "online", "d2": "online", "d3": "online"}
    assert told(c) == []
    assert coord_stats.own(c)["clock"] == {"steps_total": 1, "stepped_s": step}
    clocks.run(10)
    talk(c, clocks, "d1")  # stamped on the new wall clock
    clocks.run(25)  # d2 and d3 silent 40 s by the monotonic clock, d1 25 s
    assert statuses(c) == {"d1": "online", "d2": "stale", "d3": "stale"}
    assert sorted(told(c)) == [("d2", "stale", "raised"), ("d3", "stale", "raised")]
    clocks.run(10)  # and d1's silence is counted from its message on the new clock
    assert statuses(c)["d1"] == "stale"


def test_a_step_back_does_not_freeze_silence(coordinator):
    """Old code: a step back an hour kept every device online for that hour after it fell
    silent, and one that spoke after the step too (its last_seen kept the later time
    stamped before the step)."""
    c, clocks = coordinator(NOW)
    talk(c, clocks, "d1", "d2", "d3")
    assert statuses(c) == {"d1": "online", "d2": "online", "d3": "online"}
    clocks.run(1)
    clocks.step(-3600)
    clocks.run(1)
    talk(c, clocks, "d1")  # heard after the step
    clocks.run(31)
    assert statuses(c) == {"d1": "stale", "d2": "stale", "d3": "stale"}
    clocks.run(90)  # 120 s of d1's silence: offline
    assert statuses(c)["d1"] == "offline"


@pytest.mark.parametrize("step", [7 * DAY, -3600])
def test_an_alerts_clear_delay_is_elapsed_time(coordinator, step):
    """A stale device heard again: its clear is told once it stays away alert_clear_s (30 s)
    of elapsed time. Old code: a step forward told it at once, one back an hour late."""
    c, clocks = coordinator(NOW)
    talk(c, clocks, "d1")
    statuses(c)
    clocks.run(31)
    assert statuses(c) == {"d1": "stale"} and told(c) == [("d1", "stale", "raised")]
    talk(c, clocks, "d1")
    assert statuses(c) == {"d1": "online"}
    clocks.run(5)
    clocks.step(step)
    talk(c, clocks, "d1")
    statuses(c)
    assert told(c) == []  # 5 s away, not 30
    clocks.run(26)
    talk(c, clocks, "d1")
    statuses(c)
    assert told(c) == [("d1", "stale", "cleared")]


def test_an_offline_alerts_raise_delay_is_elapsed_time(coordinator):
    """A will: `offline` is told once it lasts offline_alert_s (60 s) of elapsed time. Old
    code: a step forward told it at once."""
    c, clocks = coordinator(NOW)
    talk(c, clocks, "d1")
    statuses(c)
    talk(c, clocks, "d1", online=False)
    assert statuses(c) == {"d1": "offline"} and told(c) == []
    clocks.run(5)
    clocks.step(7 * DAY)
    statuses(c)
    assert told(c) == []
    clocks.run(56)
    statuses(c)
    assert told(c) == [("d1", "offline", "raised")]


# -- the decisions, pure -------------------------------------------------------------------

W = NOW


@pytest.mark.parametrize("last, now, step, want", [
    ((W, 1000.0), (W + 60, 1060.0), 0.0, 0.0),  # in step: no step
    ((W, 1000.0), (W + 7 * DAY + 1, 1001.0), 0.0, 7 * DAY),  # forward 7 days
    ((W, 1000.0), (W - 3600 + 1, 1001.0), 0.0, -3600.0),  # back an hour
    ((BOOT_1970, 1000.0), (W + 1, 1001.0), 0.0, W - BOOT_1970),  # 1970, then NTP
    ((W, 1000.0), (W + 1.5, 1001.0), 0.0, 0.0),  # a slew-sized move (0.5 s): followed
    ((W, 1000.0), (W + 4.0, 1001.0), 0.0, 3.0),  # 3 s: a step
    ((W + 7 * DAY, 1000.0), (W + 1, 1001.0), 7 * DAY, 0.0),  # stepped back again: summed
])
def test_step_clock_decide(last, now, step, want):
    from runtime.wire.clock import decide

    assert decide(last, now, step, 2.0) == pytest.approx(want)


def test_step_clock_steady_time_runs_on_across_steps(caplog):
    from runtime.wire.clock import StepClock

    c = Clocks(BOOT_1970)
    sc = StepClock(lambda: c.w, lambda: c.m)
    c.run(10)
    assert sc.read() == (BOOT_1970 + 10, BOOT_1970 + 10)
    c.step(W - BOOT_1970)  # the first NTP sync
    c.run(5)
    assert sc.read() == pytest.approx((BOOT_1970 + 15, W + 15))
    assert sc.step == pytest.approx(W - BOOT_1970) and sc.jumps_total == 1
    c.run(5)
    c.step(-3600)
    assert sc.read() == pytest.approx((BOOT_1970 + 20, W + 20 - 3600))
    assert sc.jumps_total == 2 and caplog.text.count("the wall clock stepped") == 2


def test_ageing_judges_each_device_by_the_step_its_view_was_stamped_in():
    """d1 stamped before a 7-day step, d2 after: each is judged at the wall clock of its
    own stamp, and its deadline (stale at last_seen + 30 s) falls on the steady clock."""
    from runtime.coordinator import fleet
    from runtime.coordinator.ageing import Ageing

    cfg = fleet.FleetConfig(stale_after_s=30, offline_after_s=120)
    a = Ageing()
    a.reset([], step=0.0)
    a.touch("d1", 0.0)
    a.touch("d2", 7 * DAY)
    assert a.now_of("d1", W + 10) == W + 10
    assert a.now_of("d2", W + 10) == W + 10 + 7 * DAY
    assert a.now_of("d3", W + 10) == W + 10  # never touched: the reset's step
    for d, seen in (("d1", W), ("d2", W + 7 * DAY + 5)):
        a.schedule(d, fleet.DeviceView(d, online=True, status="online", last_seen=seen), cfg)
    assert a.take(W + 29) == {"d1", "d2"}  # the touches
    assert a.take(W + 31) == {"d1"} and a.take(W + 36) == {"d2"}


@pytest.mark.parametrize("seen, want", [
    (W - 10, W - 10),  # heard before: kept
    (W + 1.5, W + 1.5),  # a little ahead (another host's clock, a transaction): kept
    (W + 3600, W),  # an hour ahead (this clock stepped back since): heard now
])
def test_not_ahead(seen, want):
    from runtime.coordinator import fleet

    v = fleet.DeviceView("d", online=True, status="online", last_seen=seen)
    assert fleet.not_ahead(v, W, 2.0).last_seen == want


def test_a_row_another_coordinator_stamped_ahead_does_not_keep_a_device_fresh(tmp_path):
    """Two coordinators on one store, b's clock an hour ahead of a's (or a's stepped back an
    hour): the `last_seen` b writes is judged by a's clock from when a reads it, so a calls
    the device stale after stale_after_s of silence, not an hour later."""
    from runtime.coordinator.service import Coordinator
    from runtime.wire.clock import StepClock

    clocks = Clocks(NOW)
    made = [Coordinator(CoordinatorConfig(
        fleet="f", store=str(tmp_path / "s.db"), bundles_dir=str(tmp_path / "none"),
        share_group="g", client_id=f"c{k}", stale_after_s=30, offline_after_s=120,
        coalesce_s=0)) for k in (1, 2)]
    a, b = made
    a.clock = StepClock(lambda: clocks.w, lambda: clocks.m)
    b.clock = StepClock(lambda: clocks.w + 3600, lambda: clocks.m)
    try:
        talk(b, clocks, "d1")
        assert statuses(a) == {"d1": "online"}
        assert a.views["d1"].last_seen == NOW  # heard when a read b's row, by a's clock
        clocks.run(31)
        assert statuses(a) == {"d1": "stale"}
    finally:
        for c in made:
            c.store.close()
            c.shelf.close()
