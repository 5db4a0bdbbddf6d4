"""Daemon in the loop: the real `edgerun serve` process against the simulated plant
(tools/simloop.py), compared with the pure simulation of the same scenario. Both call the one
control step (power/control.py); this proves the daemon actually acts on it. In lockstep
(power/simclock.py) the plant moves by exactly the time the daemon ticked, so the run takes
the pure simulation's decisions to the last inference, at whatever pace this host allows."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import bundled
from power.closed_loop import simulate
from power.plant import SCENARIOS, ambient
from power.rungs import on_device
from runtime.choice.ladders import ladder_for
from runtime.choice.measure import recorded_profiles
from runtime.choice.selector import Constraints
from runtime.device.profiles import load_profile
from runtime.tools import simloop

PROFILES = bundled() / "reference-profiles.json"


def _rungs(dev):
    ps = recorded_profiles(PROFILES)
    rungs, _ = ladder_for(list(ps.values()), Constraints(20.0))
    return on_device(rungs, [ps[r.variant_id].cpu_ms / 1e3 for r in rungs], dev.power)


@pytest.mark.parametrize("policy", ["step_wise"])
def test_the_daemon_steps_down_before_the_trip_and_matches_the_simulation(tmp_path, policy):
    dev = load_profile("rpi5")
    rungs = _rungs(dev)
    rate = rungs[-1].max_rate_hz()
    hours = 1.0
    kernel = simulate(dev, rungs, ambient(*SCENARIOS["hot"]), "kernel", hours * 3600, rate,
                      0.020, t0=8 * 3600)
    pure = simulate(dev, rungs, ambient(*SCENARIOS["hot"]), policy, hours * 3600, rate, 0.020,
                    t0=8 * 3600)
    assert kernel.throttled_min > 0  # the scenario needs a governor at all
    # as fast as the host goes: the pace changes the wall time, never a decision
    res = simloop.run(tmp_path, "rpi5", "hot", policy, hours, rate, PROFILES, speed=3000.0)
    sim = res.simulated
    assert res.exit_code == 0, res.log[-2000:]
    assert sim["elapsed_s"] == hours * 3600  # the simulated clock stopped there
    assert sim["critical_trips"] == 0 and sim["throttled_min"] == 0, sim
    assert sim["rung_changes"] >= 1, "the daemon never moved off the top rung"
    n = len(rungs)  # logged with the same numbering as health: the top rung is n/n
    assert f"rung {n}/{n} -> {n - 1}/{n}" in res.log, res.log[-2000:]
    # the same decisions as the pure simulation, at the same simulated seconds (health
    # rounds the tally to 0.1)
    assert sim["rung_changes"] == pure.rung_changes, (sim, pure)
    assert sim["good_weighted"] == pytest.approx(pure.good_weighted, abs=0.1), (
        sim["good_weighted"], pure.good_weighted)
    assert res.health["governor"]["enabled"] is True


def test_the_reference_profiles_match_what_the_daemon_plans():
    """The demo and the daemon-in-the-loop replay the reference profiles by variant id: the
    recording config (bench/data/ladder-profile.toml) and the replaying one must agree, and
    the recording must cover the ladder the daemon builds."""
    import tomllib

    from runtime.tools.simloop import REFERENCE_BACKENDS

    root = Path(__file__).resolve().parents[2]
    recorded = tomllib.loads((root / "bench" / "data" / "ladder-profile.toml").read_text())
    assert recorded["backends"] == tomllib.loads(REFERENCE_BACKENDS)["backends"]
    ps = recorded_profiles(PROFILES)
    rungs, _ = ladder_for(list(ps.values()), Constraints(20.0))
    assert len(rungs) >= 2 and all(r.variant_id in ps for r in rungs)
