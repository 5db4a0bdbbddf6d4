"""The simulator against closed-form RC solutions, and read back through the real sensors."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from power.closed_loop import simulate
from power.device import ThermalModel
from power.plant import Plant, ambient, rc_step, solar_trace
from power.rungs import Rung, on_device
from power.sensors import SensorSet, read_trips
from runtime.device.profiles import load_profile


def test_rc_step_matches_closed_form():
    # T(t) = T_amb + P R (1 - e^(-t/RC)) from T_amb, whatever the step size
    r, c, p, amb = 2.0, 50.0, 10.0, 25.0
    for dt in (0.1, 1.0, 7.0):
        temp, t = amb, 0.0
        while t < 300:
            temp = rc_step(temp, amb, p, r, c, dt)
            t += dt
        assert temp == pytest.approx(amb + p * r * (1 - math.exp(-t / (r * c))), rel=1e-9)


def test_two_node_steady_state_and_single_node_limit():
    dev = load_profile("generic-x86")
    m = dev.thermal.model
    plant = Plant(dev, ambient("constant", 25.0))
    for _ in range(30000):  # 8+ case time constants
        plant.step(1.0, 10.0)
    total = dev.power.idle_w + 10.0
    assert plant.s.case_c == pytest.approx(25 + total * m.r_case_amb, abs=0.05)
    assert plant.s.die_c == pytest.approx(25 + total * (m.r_case_amb + m.r_die_case), abs=0.05)
    # a die with a negligible capacitance follows one RC node (the case) exactly
    tiny = replace(dev, thermal=replace(dev.thermal, model=ThermalModel(
        r_die_case=0.01, c_die=0.1, r_case_amb=2.0, c_case=100.0)))
    plant = Plant(tiny, ambient("constant", 25.0))
    for _ in range(100):
        plant.step(1.0, 2.0)
    want = 25 + (tiny.power.idle_w + 2.0) * 2.0 * (1 - math.exp(-100 / 200.0))
    assert plant.s.case_c == pytest.approx(want, rel=2e-3)


def test_sysfs_tree_reads_back_through_sensors(tmp_path):
    dev = load_profile("solar-node")
    plant = Plant(dev, ambient("constant", 30.0), root=tmp_path, battery_frac=0.5,
                  irradiance=solar_trace(1, seed=1), t0=12 * 3600)
    plant.step(1.0, 1.0)
    sensors = SensorSet(tmp_path, dev.thermal.zone, dev.battery.path, dev.solar.path)
    r = sensors.read()
    assert r.valid, r.problems
    assert r.temp_c == pytest.approx(plant.s.die_c, abs=1e-3)
    assert r.battery_wh == pytest.approx(plant.s.battery_wh, abs=1e-5)
    assert r.harvest_w == pytest.approx(plant.s.harvest_w, abs=1e-5)
    trips = read_trips(tmp_path / dev.thermal.zone)
    assert [t.type for t in trips] == ["passive", "hot", "critical"]
    assert trips[0].temp_c == dev.thermal.trip("passive").temp_c


def test_garbage_sensor_is_an_invalid_reading(tmp_path):
    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("garbage\n")
    r = SensorSet(tmp_path, "sys/class/thermal/thermal_zone0").read()
    assert not r.valid and r.temp_c is None and "expected an integer" in r.problems[0]
    (zone / "temp").write_text("999999\n")  # 999.999 °C: not physical
    assert "outside" in SensorSet(tmp_path, "sys/class/thermal/thermal_zone0").read().problems[0]
    assert not SensorSet(tmp_path, "sys/class/thermal/thermal_zone7").read().valid


def test_solar_trace_is_deterministic_and_bounded():
    a, b = solar_trace(14, seed=3), solar_trace(14, seed=3)
    assert (a == b).all() and a.min() >= 0 and a.max() <= 1
    assert a[:12].max() == 0  # midnight to 01:00 is dark
    assert (solar_trace(14, seed=4) != a).any()


def test_closed_loop_governor_avoids_throttling_where_kernel_does_not():
    dev = load_profile("generic-x86")
    rungs = on_device([Rung("small", 0.69, 0, 0.0074), Rung("big", 0.76, 0, 0.085)],
                          [0.0059, 0.078], dev.power)
    rate, target = rungs[-1].max_rate_hz(), 1.5 * rungs[-1].latency_s
    hot = ambient("constant", 40.0)
    kernel = simulate(dev, rungs, hot, "kernel", 3 * 3600, rate, target)
    assert kernel.throttled_min > 0
    for policy in ("step_wise", "power_allocator"):
        r = simulate(dev, rungs, hot, policy, 3 * 3600, rate, target)
        assert r.critical_trips == 0 and r.throttled_min == 0, policy
        assert r.good_weighted > 1.2 * kernel.good_weighted, policy


@pytest.fixture(scope="module")
def solar_runs():
    """Four days of the solar node with a cloudy spell, every energy policy on the same trace."""
    dev = load_profile("solar-node")
    rungs = on_device([Rung("small", 0.80, 0, 0.0074), Rung("big", 0.99, 0, 0.03)],
                          [0.0059, 0.025], dev.power)
    irr = solar_trace(4, seed=7)  # days: sunny, sunny, overcast, overcast
    slot_wh = (irr * dev.solar.panel_w * 300 / 3600).reshape(-1, 12).sum(axis=1)
    common = dict(duration_s=4 * 86400, rate_hz=rungs[-1].max_rate_hz(),
                  latency_target_s=1.5 * rungs[-1].latency_s, dt=300.0, irradiance=irr,
                  battery_frac=0.6)
    amb = ambient("constant", 20.0)
    runs = {p: simulate(dev, rungs, amb, "step_wise", energy_policy=p,
                        oracle_forecast=slot_wh if p == "oracle" else None, **common)
            for p in ("none", "greedy", "energy", "oracle")}
    runs["fixed0"] = simulate(dev, rungs, amb, "step_wise", energy_policy="fixed", fixed_w=0.0,
                              **common)
    return runs


def test_energy_policies_table(solar_runs):
    r = solar_runs
    assert r["greedy"].below_reserve_h > 0  # spends to the reserve, then the clouds come
    assert r["none"].below_reserve_h >= r["greedy"].below_reserve_h
    assert r["energy"].below_reserve_h == 0  # the buffer carries it through
    assert r["oracle"].below_reserve_h == 0
    # 0 W is minimum duty (0.2 Hz), never "uncapped" and never nothing
    assert r["fixed0"].good == pytest.approx(0.2 * 4 * 86400) and r["fixed0"].below_reserve_h == 0
    assert 0 < r["energy"].good_weighted < r["greedy"].good_weighted


def test_unknown_energy_policy_is_an_error():
    dev = load_profile("solar-node")
    with pytest.raises(ValueError, match="unknown energy policy"):
        simulate(dev, [Rung("a", 1.0, 0.01, 0.01)], ambient("constant", 20.0), "step_wise",
                 600, 1.0, 1.0, dt=60, irradiance=solar_trace(1, 1), energy_policy="bogus")


def test_a_dead_sensor_vanishes_from_the_tree_until_it_comes_back(tmp_path):
    """DEAD_SENSORS (bench/field_soak.py's fault): the listed file is removed and not
    written while the list names it; the rest of the tree moves on; written again after."""
    from power.plant import DEAD_SENSORS

    dev = load_profile("rpi5")
    plant = Plant(dev, ambient("constant", 25.0), root=tmp_path)
    temp = tmp_path / dev.thermal.zone / "temp"
    plant.step(1.0, 5.0)
    assert temp.exists()
    (tmp_path / DEAD_SENSORS).write_text(f"{dev.thermal.zone}/temp\n")
    plant.step(60.0, 5.0)
    assert not temp.exists()
    assert (tmp_path / dev.thermal.zone / "trip_point_0_temp").exists()
    plant.step(60.0, 5.0)
    assert not temp.exists()  # still dead
    (tmp_path / DEAD_SENSORS).unlink()
    plant.step(1.0, 5.0)
    assert int(temp.read_text()) == round(plant.s.die_c * 1000)


@pytest.mark.parametrize("repeats, t, share", [
    (False, 450.0, 0.5),  # inside the trace
    (False, 900.0, 1.0),  # past its end: the last value holds (a trace made for the run)
    (False, 1200.0, 1.0),
    (True, 900.0, 0.0),  # past its end: it starts again (a year of weather, no end)
    (True, 1200.0, 0.5),
])
def test_an_irradiance_trace_past_its_end_holds_or_repeats(repeats, t, share):
    dev = load_profile("solar-node")
    plant = Plant(dev, ambient("constant", 20.0), irradiance=np.array([0.0, 0.5, 1.0]),
                  irradiance_step_s=300.0, irradiance_repeats=repeats)
    assert plant.harvest_w(t) == dev.solar.panel_w * share


def test_a_dead_sensor_whose_value_did_not_change_is_written_again_when_back(tmp_path):
    """A trip point is a constant: brought back, it must be written though its text is
    what was last written before it died (the writer skips unchanged files)."""
    from power.plant import DEAD_SENSORS

    dev = load_profile("rpi5")
    plant = Plant(dev, ambient("constant", 25.0), root=tmp_path)
    trip = tmp_path / dev.thermal.zone / "trip_point_0_temp"
    plant.step(1.0, 5.0)
    text = trip.read_text()
    (tmp_path / DEAD_SENSORS).write_text(f"{dev.thermal.zone}/trip_point_0_temp\n")
    plant.step(1.0, 5.0)
    assert not trip.exists()
    (tmp_path / DEAD_SENSORS).unlink()
    plant.step(1.0, 5.0)
    assert trip.read_text() == text
