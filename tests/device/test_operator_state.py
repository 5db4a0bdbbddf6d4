"""What the control loop learned survives restarts: the harvest forecast (a solar node learns it
over days) and the operator's rate cap (runtime/device/operator_state.py)."""

from __future__ import annotations

import json
import math

import pytest
from support.daemon_harness import Serve, events, last_health, write_config
from support.waiting import wait

from power import control
from power import energy as energy_mod
from power.plant import solar_trace
from power.rungs import Rung
from power.sensors import Reading
from runtime.device import operator_state
from runtime.device.profiles import load_profile

RUNGS = [Rung("small", 0.80, 0.2, 0.005), Rung("big", 0.98, 0.6, 0.010)]  # 2 W and 6 W at 10 Hz


def _trace(dev, days=3, step_s=600.0):
    irr = solar_trace(days, seed=7, step_s=step_s)
    bat = dev.battery.capacity_wh * 0.6
    return [Reading(i * step_s, temp_c=30.0, battery_wh=bat, harvest_w=dev.solar.panel_w * x)
            for i, x in enumerate(irr)]


def test_a_restart_mid_trace_keeps_the_forecast(tmp_path):
    """Run 3 days of a solar trace through the control step; once uninterrupted, once with a
    save + load (what a restart does) in the middle of day 2: the decisions match."""
    dev = load_profile("solar-node")
    b = dev.battery
    cfg = control.ControlConfig(None, energy_mod.EnergyConfig(
        b.capacity_wh, dev.power.idle_w, math.inf, b.reserve_frac, b.charge_efficiency),
        rate_hz=10.0)
    readings = _trace(dev)
    half = len(readings) * 5 // 9

    def run(restart: bool) -> list[float]:
        s, budgets = control.ControlState(), []
        for i, r in enumerate(readings):
            if restart and i == half:
                operator_state.save_control(tmp_path / "control.json", s.energy, 2.0)
                energy, rate = operator_state.load_control(tmp_path / "control.json")
                assert rate == 2.0
                s = control.ControlState(energy=energy)  # everything else starts afresh
            s, out = control.step(s, r, RUNGS, cfg, 1)
            budgets.append(out.budget_w)
        return budgets

    straight, restarted = run(False), run(True)
    assert any(0 < b < math.inf for b in straight[half:])  # the forecast matters after half
    assert restarted == straight
    energy, _ = operator_state.load_control(tmp_path / "control.json")
    s = control.ControlState()  # without the file: the forecast starts from zero again
    for r in readings[half:half + 10]:
        s, _ = control.step(s, r, RUNGS, cfg, 1)
    assert sum(s.energy.seen) <= 2 < sum(energy.seen)


@pytest.mark.parametrize("content", ["{not json", '{"v": 1, "operator_rate_hz": -3}',
                                     '{"v": 1, "energy": {"forecast_wh": ["x"], "seen": [1]}}',
                                     '{"v": 99}'])
def test_a_broken_file_is_moved_aside_and_the_loop_starts_fresh(tmp_path, content):
    f = tmp_path / "control.json"
    f.write_text(content)
    assert operator_state.load_control(f) == (None, math.inf)
    assert (tmp_path / "control.json.bad").read_text() == content and not f.exists()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


def test_the_daemon_restores_the_operator_cap_at_start(tmp_path, cache):
    cfg = write_config(tmp_path, cache)
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    (tmp_path / "state" / "control.json").write_text(json.dumps(
        {"v": 1, "operator_rate_hz": 3.0, "energy": None}))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: (last_health(d.outbox) or {}).get("operator_rate_hz") == 3.0, 60,
             "the restored operator cap in health", d)
        assert last_health(d.outbox)["rate_cap_hz"] == 3.0
        assert "control state restored" in d.text()
        assert d.stop() == 0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert not events(d.outbox, "control_failed")


def test_a_missing_thermal_sensor_disables_the_governor_loudly(tmp_path, cache):
    """No sensor at start-up: inspection goes on, the governor is off, and health, an event
    and the log say so (never a silent 1/8 rate)."""
    cfg = write_config(tmp_path, cache)
    (tmp_path / "sysfs" / "sys/class/thermal/thermal_zone0/temp").unlink()
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: (last_health(d.outbox) or {}).get("pipeline", {}).get("results", 0) > 20,
             60, "results", d)
        h = last_health(d.outbox)
        assert h["governor"]["enabled"] is False
        assert "no thermal sensor found" in h["governor"]["disabled_reason"]
        assert h["rate_cap_hz"] is None and h["rung"] == h["rungs"]  # full precision, uncapped
        ev = events(d.outbox, "governor_disabled")
        assert ev and ev[0]["severity"] == "critical"
        assert "CRITICAL" in d.text()
        assert d.stop() == 0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
