"""bench/field_soak.py: the soak's pure parts table-tested (the fault schedule, the slope
within process lives, the tally of lost and duplicated results, the per-day figures), and
two simulated days of it against the real broker, coordinator and daemons (slow)."""

from __future__ import annotations

import itertools
import json

import pytest
from support.benches import load_bench

from models import bundled

soak = load_bench("field_soak")
Fault = soak.Fault


@pytest.mark.parametrize("days", [1, 2, 14])
def test_schedule_kills_each_daemon_daily_away_from_the_other_faults(days):
    faults = soak.schedule(days)
    assert faults == sorted(faults, key=lambda f: (f.at_h, f.device))
    assert all(f.at_h > 0 and f.end_h < days * 24 for f in faults)
    kinds = {f.kind for f in faults}
    assert kinds == {"broker_restart", "network_cut", "disk_full", "dead_sensor", "kill9",
                     "clock_jump"} | ({"ota_update"} if days > 1 else set())
    kills = [f for f in faults if f.kind == "kill9"]
    for dev in soak.DEVICES:  # one a day each (none where a day has no room left)
        got = [int(f.at_h // 24) for f in kills if f.device == dev]
        assert len(got) == len(set(got)) and len(got) >= days - 1, (dev, got)
    for k in kills:  # never inside or beside another fault on the same device or the link
        for f in faults:
            if f.kind != "kill9" and (f.device == k.device or f.kind in
                                      ("broker_restart", "network_cut")):
                assert not (f.at_h - soak.KILL_MARGIN_H <= k.at_h
                            <= f.end_h + soak.KILL_MARGIN_H), (k, f)
    timed = [f for f in faults if f.dur_h]  # no two windows on one device or the link meet
    for a, b in itertools.combinations(timed, 2):
        if a.device == b.device or {a.kind, b.kind} & soak.SHARED:
            assert a.end_h < b.at_h or b.end_h < a.at_h, (a, b)


@pytest.mark.parametrize(("days", "want"), [
    (1, None),  # half-way (12 h) is 0.72 h after a broker restart: no room
    (2, 24.0),  # day 1 of 2: 1.44 h after the broker restart, 1.8 h before the cut
    (3, 36.0),
    (14, 168.0),  # day 7 of 14
])
def test_ota_update_half_way_on_each_device(days, want):
    ota = [f for f in soak.schedule(days) if f.kind == "ota_update"]
    if want is None:
        assert ota == []
        return
    assert sorted(f.device for f in ota) == sorted(soak.DEVICES)
    for f in ota:
        assert f.at_h == want and f.dur_h == soak.OTA_H
        others = [g for g in soak.schedule(days) if g is not f and g.kind != "ota_update"
                  and (g.device == f.device or g.kind in soak.SHARED)]
        for g in others:  # nothing else on the device or the link in its window or beside it
            margin = soak.KILL_MARGIN_H if g.kind == "kill9" else soak.OTA_MARGIN_H
            assert g.end_h < f.at_h - margin or g.at_h > f.end_h + margin, (f, g)


@pytest.mark.parametrize(("placed", "want"), [
    ([], 24.0),
    ([Fault("broker_restart", "cabinet", 23.5)], None),  # the link: every device
    ([Fault("network_cut", "cabinet", 27.5, 2.0)], None),
    ([Fault("dead_sensor", "cabinet", 26.0, 1.0)], None),  # the device itself
    ([Fault("dead_sensor", "solar", 26.0, 1.0)], 24.0),  # another device
    ([Fault("kill9", "cabinet", 25.0)], 24.0),  # kills are placed around it, not it around them
    ([Fault("broker_restart", "cabinet", 22.9)], 24.0),  # 1.1 h before: room enough
])
def test_ota_time(placed, want):
    assert soak.ota_time(2, placed, "cabinet") == want


def test_ota_time_needs_its_window_before_the_end():
    assert soak.ota_time(1, [], "cabinet") == 12.0
    assert soak.OTA_SHARE * 24 + soak.OTA_H + soak.OTA_MARGIN_H <= 24  # so the table holds


def test_schedule_leaves_out_what_cannot_be_injected():
    faults = soak.schedule(2, left_out=("disk_full", "clock_jump", "ota_update"))
    assert {f.kind for f in faults} == {"broker_restart", "network_cut", "dead_sensor",
                                        "kill9"}


@pytest.mark.parametrize(("samples", "want"), [
    # one life, 2 MB a day
    ([(1, 0.0, 100.0), (1, 1.0, 102.0), (1, 2.0, 104.0)], 2.0),
    # two lives, each flat: the restart's drop is no slope
    ([(1, 0.0, 150.0), (1, 1.0, 150.0), (2, 1.5, 90.0), (2, 2.5, 90.0)], 0.0),
    # two lives each growing 1 a day from different levels (a pooled line would fall)
    ([(1, 0.0, 200.0), (1, 1.0, 201.0), (2, 1.0, 100.0), (2, 2.0, 101.0)], 1.0),
    ([(1, 0.0, 1.0), (1, 1.0, 2.0)], None),  # too few
    ([(1, 1.0, 1.0), (2, 1.0, 2.0), (3, 1.0, 3.0)], None),  # no spread within a life
])
def test_slope_within_lives(samples, want):
    got = soak.slope_within(samples)
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize(("made", "stored", "want"), [
    (3, [("s", 1, "a"), ("s", 2, "b"), ("s", 3, "c")], (3, 0, 0)),
    (4, [("s", 1, "a"), ("s", 3, "c")], (2, 2, 0)),  # 2 and 4 lost
    (2, [("s", 1, "a"), ("s", 2, "a")], (2, 0, 1)),  # one result stored under two seqs
    (2, [("s", 1, "a"), ("s", 1, "a"), ("s", 2, "b")], (2, 0, 2)),  # a seq twice
    (0, [], (0, 0, 0)),
])
def test_tally(made, stored, want):
    t = soak.tally(made, stored)
    assert (t.stored, t.lost, t.duplicated) == want


def test_per_day_and_gains():
    assert soak.per_day([(1.0, 50.0), (23.9, 70.0), (24.5, 60.0)]) == {0: 70.0, 1: 60.0}
    # life a: 0..30 h, cumulative 10 at 12 h, 24 at 24 h, 30 at 30 h; life b starts at 30 h
    lives = {"a": [(12.0, 10.0), (24.0, 24.0), (30.0, 30.0)], "b": [(36.0, 5.0)]}
    assert soak.gains_per_day(lives) == {0: 24.0, 1: 11.0}


def test_health_change_names_the_fault_counters():
    before = {"t": 1.0, "mqtt": {"connected": True, "disconnects_total": 2}, "temp_c": 50}
    after = {"t": 9.0, "mqtt": {"connected": True, "disconnects_total": 3}, "temp_c": 51}
    assert soak.health_change(before, after) == ["mqtt.disconnects_total: 2 -> 3"]
    assert soak.health_change(before, before) == []


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_days_in_the_field_lose_nothing(tmp_path):
    """Two simulated days of the soak: every result made is stored once (across the OTA
    swap too), each daemon's RSS measured, nothing crashed, every fault happened, the die
    under the trip each day, and half-way each device installed the new version, passed its
    probation and served it from then on (the solar node's governor moves the new version
    off the swap's form: compared with the old version's session of each form, like with
    like, the identical network agrees)."""
    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    r = soak.soak(tmp_path / "soak", days=2, speed=1500.0, wall_limit_s=1300)
    text = soak.render(r)
    print(text)
    (tmp_path / "report.json").write_text(json.dumps(soak.asdict(r)))
    assert r.finished, text
    for name, t in r.tallies.items():
        assert t["made"] > 0 and t["stored"] == t["made"], (name, text)
        assert t["lost"] == 0 and t["duplicated"] == 0, (name, text)
    assert not any(r.crashes.values()), text
    assert all(code == 0 for code in r.exit_codes.values()), text
    done = {f["kind"] for f in r.faults}
    assert done >= {"broker_restart", "network_cut", "dead_sensor", "kill9", "ota_update"}, text
    # the OTA update (day 1 of 2): rolled out through the coordinator's API, swapped in,
    # probation passed, the rollout done, and every health from the verdict on (the kill -9
    # restarts after it included) reports the new version
    want = f"inspection@{soak.OTA_VERSION}"
    assert set(r.ota) == set(soak.DEVICES), text
    for dev, o in r.ota.items():
        assert "refused" not in o, (dev, text)
        assert "model_swapped" in o["events"] and "model_deploy_failed" not in o["events"], \
            (dev, text)
        assert o.get("verdict") == "model_probation_passed", (dev, text)
        assert "model_rolled_back" not in o["events"], (dev, text)
        assert o["model_version"] == want and o["served_after"] == [want], (dev, text)
        assert (o["rollout_state"], o["device_state"]) == ("done", "passed"), (dev, text)
    for d in r.daily:  # the governor kept the die under the trip every day
        assert d["die_max_c"] is None or d["die_max_c"] < d["trip_c"], text
    # RSS is measured and printed, not judged here: with a kill -9 each day no daemon lives
    # past ~35 simulated hours, too short to tell a leak from start-up growth (which levels
    # off after ~40 h in a life of 3 days: docs/daemon.md, "Field soak"). The 1 MB a day
    # target is judged on single lives (`bench/field_soak.py --no-kill`), and not met yet.
    rss = {x["process"]: x["per_day"] for x in r.resources if x["figure"] == "rss_mb"}
    assert all(rss[name] is not None for name in ("serve cabinet", "serve solar")), text
