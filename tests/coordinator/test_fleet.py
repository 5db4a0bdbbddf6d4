"""The coordinator's fleet state machine and alerts: pure tables."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from runtime.coordinator import fleet

CFG = fleet.FleetConfig(stale_after_s=30, offline_after_s=120)


def _birth(t, boot="b1", version="1.0"):
    return {"v": 1, "online": True, "boot": boot, "t": t, "versions": {"edgerun": version},
            "choice": "m/fp32@ort"}


def _death(t, boot="b1"):
    return {"v": 1, "online": False, "boot": boot, "t": t, "reason": "connection lost"}


def _bye(t, boot="b1"):
    return {"v": 1, "online": False, "boot": boot, "t": t, "reason": "clean shutdown"}


def _asleep(t, wake_at):
    return {"v": 1, "online": False, "boot": "b1", "t": t, "reason": "sleep", "asleep": True,
            "wake_at": wake_at}


@pytest.mark.parametrize("events, now, status", [
    ([("state", _birth(0), 0)], 10, "online"),
    ([("state", _birth(0), 0)], 31, "stale"),
    ([("state", _birth(0), 0)], 121, "offline"),
    ([("state", _birth(0), 0), ("activity", None, 100)], 125, "online"),
    ([("state", _birth(0), 0), ("state", _death(5), 5)], 6, "offline"),
    # the will carries the connect time (older than the birth) but arrives after it
    ([("state", _birth(10), 10), ("state", _death(5), 11)], 12, "offline"),
    # a previous boot's late state does not override the current boot
    ([("state", _birth(10, "b2"), 10), ("state", _death(5), 11)], 12, "online"),
    # a new boot's birth after a death
    ([("state", _death(5), 5), ("state", _birth(6, "b2"), 6)], 7, "online"),
    # a will arriving after the same boot's farewell (its DISCONNECT was lost) changes nothing
    ([("state", _birth(10), 10), ("state", _bye(20), 20), ("state", _death(10), 21)], 22,
     "offline"),
    ([("state", _birth(10), 10), ("state", _asleep(20, 500), 20), ("state", _death(10), 21)],
     22, "asleep"),
    # ... but the will of a connection made after the sleep (woke, then lost) is news
    ([("state", _asleep(20, 500), 20), ("state", _death(30), 31)], 32, "offline"),
    # traffic after a death (lost birth) brings it back
    ([("state", _death(5), 5), ("activity", None, 8)], 9, "online"),
])
def test_status_table(events, now, status):
    v = fleet.DeviceView("d")
    for kind, msg, t in events:
        v = fleet.on_state(v, msg, t) if kind == "state" else fleet.on_activity(v, t)
    assert fleet.tick(v, now, CFG).status == status
    # views are copied attribute by attribute (fleet._with): nothing but the fields
    assert set(vars(fleet.tick(v, now, CFG))) == set(fleet.DeviceView.__dataclass_fields__)


@pytest.mark.parametrize("health, codes", [
    ({}, []),
    ({"throttled": True}, ["throttled"]),
    ({"temp_c": 76.0, "passive_trip_c": 80.0}, ["hot"]),
    ({"temp_c": 60.0, "passive_trip_c": 80.0}, []),
    ({"slo": {"compliance": 0.5}}, ["slo"]),
    ({"backlog": {"results_held": 5000, "evicted_total": 3}}, ["backlog", "evicted"]),
])
def test_alerts_table(health, codes):
    v = fleet.on_activity(fleet.on_state(fleet.DeviceView("d"), _birth(0), 0), 1, health)
    assert [c for c, _ in fleet.alerts(v, CFG, "1.0")] == codes


@pytest.mark.parametrize("slo, says", [
    ({"compliance": 0.5, "of": "end_to_end"}, "of frames end to end"),
    ({"compliance": 0.5, "of": "inference"}, "of inferences"),
    ({"compliance": 0.5}, "of inferences"),  # a device from before the field
    # hostile or broken: never a traceback, never echoed
    ({"compliance": 0.5, "of": {"x": [1] * 1000}}, "of inferences"),
    ({"compliance": 0.5, "of": "end_to_end" * 10_000}, "of inferences"),
])
def test_the_slo_alert_says_what_was_judged(slo, says):
    v = fleet.on_activity(fleet.on_state(fleet.DeviceView("d"), _birth(0), 0), 1, {"slo": slo})
    (code, text), = fleet.alerts(v, CFG, "1.0")
    assert code == "slo" and text.endswith(says) and len(text) < 100, text


@pytest.mark.parametrize("of, admitted", [
    ("inference", True), ("end_to_end", True), ("frames", False), (7, False), (None, False),
    ({"deep": {"er": []}}, False), ("x" * 100_000, False),
])
def test_the_health_schema_admits_only_the_two_slo_kinds(of, admitted):
    from runtime.wire import payloads

    body = {"v": 1, "t": 1.0, "boot": "b", "slo": {"target_ms": 20.0, "compliance": 1.0,
                                                   "of": of}}
    try:
        payloads.check("health", body)
        ok = True
    except payloads.PayloadError:
        ok = False
    assert ok is admitted


def test_version_drift_against_majority():
    views = {}
    for i, ver in enumerate(["1.0", "1.0", "0.9"]):
        views[f"d{i}"] = fleet.on_state(fleet.DeviceView(f"d{i}"), _birth(0, version=ver), 0)
    out = fleet.refresh(views, 1, CFG)
    assert [c for c, _ in out["d2"].alerts] == ["version"]
    assert out["d0"].alerts == ()
    stale = fleet.refresh(out, 40, CFG)
    assert fleet.transitions(out, stale) == [(k, "online", "stale") for k in ("d0", "d1", "d2")]


# (events, when the view is ticked, expected next_change); then the property: tick keeps the
# status up to next_change and changes it right after (or never, for math.inf)
@pytest.mark.parametrize("events, at, due", [
    ([("state", _birth(0), 0)], 0, 30),                      # online: at the stale threshold
    ([("state", _birth(0), 0), ("activity", None, 50)], 60, 80),  # ... from the last message
    ([("state", _birth(0), 0)], 31, 120),                    # stale: at the offline threshold
    ([("state", _birth(0), 0)], 121, math.inf),              # offline by silence: a message
    ([("state", _birth(0), 0), ("state", _death(5), 5)], 6, math.inf),  # dead: a message
    ([("state", _asleep(0, 1000), 0)], 10, 1300),            # asleep: wake + margin (300)
    ([("state", _asleep(0, 1000), 0)], 1301, math.inf),      # missed its wake: offline
    ([("state", _asleep(0, 1000), 0), ("activity", None, 900)], 901, 930),  # woke early
])
def test_next_change_table(events, at, due):
    v = fleet.DeviceView("d")
    for kind, msg, t in events:
        v = fleet.on_state(v, msg, t) if kind == "state" else fleet.on_activity(v, t)
    v = fleet.tick(v, at, CFG)
    assert fleet.next_change(v, CFG) == due
    if due == math.inf:
        assert fleet.tick(v, 1e9, CFG).status == v.status
    else:
        assert fleet.tick(v, due, CFG).status == v.status
        assert fleet.tick(v, due + 1e-6, CFG).status != v.status


def test_next_change_of_a_view_nobody_ticked_is_now():
    """A status tick would not give (a view restored or forged) is due at once."""
    v = fleet.on_state(fleet.DeviceView("d"), _birth(0), 0)
    assert fleet.next_change(replace(v, status="asleep"), CFG) == -math.inf
    dead = fleet.on_state(v, _death(1), 1)
    assert fleet.next_change(replace(dead, status="online"), CFG) == -math.inf
    # stale_after_s above offline_after_s: online goes straight to offline
    odd = fleet.FleetConfig(stale_after_s=200, offline_after_s=120)
    assert fleet.next_change(v, odd) == 120 and fleet.tick(v, 120.1, odd).status == "offline"


def test_majority_ties_do_not_depend_on_order():
    a = [fleet.on_state(fleet.DeviceView(f"d{i}"), _birth(0, version=v), 0)
         for i, v in enumerate(["1.0", "2.0"])]
    assert fleet.majority_version(a) == fleet.majority_version(a[::-1]) == "2.0"
    assert fleet.majority_of({"1.0": 3, "2.0": 1}) == "1.0"
    assert fleet.majority_of({}) is None and fleet.majority_of({"1.0": 0}) is None


def test_will_after_farewell_keeps_the_farewell():
    """The demo's clean stop read 'connection lost' in a CI run: the will outran nothing, it
    followed the farewell because the DISCONNECT never reached the broker."""
    v = fleet.on_state(fleet.DeviceView("d"), _birth(10), 10)
    v = fleet.on_state(v, _bye(20), 20)
    v = fleet.on_state(v, _death(10), 21)
    assert (v.status, v.reason, v.state_t) == ("offline", "clean shutdown", 20)
    # a will newer than the goodbye (a later connection of the same boot) is taken
    assert fleet.on_state(v, _death(25), 26).reason == "connection lost"


@pytest.mark.parametrize("clk, placed", [
    # an unsynced clock (a box that booted at 1970): its wake is the sleep it announced,
    # wake_at - t (two readings of one clock, moments apart), from the arrival
    ({"sync": False, "kb": "k1", "bt": 40.0}, True),
    # a synced clock is believed as it is (a retained sleep re-read at a coordinator start
    # must not move its wake by the coordinator's downtime)
    ({"sync": True, "kb": "k1", "bt": 40.0}, False),
])
def test_a_sleep_announced_by_an_unsynced_clock_is_timed_from_its_arrival(clk, placed):
    """Found 2026-12-07 (outside run): a solar node booted at 1970 announced each 4-minute
    sleep with wake_at in 1970; the coordinator compared it with its own 2026 clock, so the
    node turned `offline` with a `missed_wake` alert the moment it fell asleep, every sleep."""
    arrived = 1_796_677_000.0
    msg = dict(_asleep(86_400.0, 86_400.0 + 245.0), clk=clk)
    v = fleet.on_state(fleet.DeviceView("d"), msg, arrived)
    if placed:
        assert v.wake_at == arrived + 245.0
        assert fleet.tick(v, arrived + 245.0 + 300.0, CFG).status == "asleep"
        assert fleet.tick(v, arrived + 245.0 + 301.0, CFG).status == "offline"
    else:
        assert v.wake_at == 86_400.0 + 245.0
    # placed at ingest (its kernel boot's offset known: clock_place keeps the claim in
    # clk.claimed and t is the placed time): the wake moves by the same offset
    placed = dict(_asleep(arrived - 2.0, 86_400.0 + 245.0),
                  clk={**clk, "claimed": 86_400.0})
    if placed["clk"]["sync"] is False:
        assert fleet.on_state(fleet.DeviceView("d"), placed, arrived).wake_at == (
            arrived - 2.0 + 245.0)
    # either way a wake is believed at most LONGEST_SLEEP_S from the arrival
    far = dict(_asleep(86_400.0, 86_400.0 + 1e9), clk=clk)
    assert fleet.on_state(fleet.DeviceView("d"), far, arrived).wake_at <= (
        arrived + fleet.LONGEST_SLEEP_S)
