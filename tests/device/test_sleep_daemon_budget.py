"""The shipped daemon on the simulated solar node at half charge, no sun, over one simulated
hour in lockstep (runtime/tools/simloop.py): with `[sleep]` the duty cycle spends the battery
and the rung stays the thermal governor's (the top one in the cool); without it the energy
budget at the idle floor steps the rung down, as it always did (docs/sleep.md, "One battery,
one planner"; the pure table is tests/power/test_sleep_budget.py).

The fault (2026-12-07): with sleep on, the control step's energy budget planned 0.00 W (the
1.2 W idle floor for 24 h) and served the cheapest rung at minimum duty while the sleep plan
had 1.186 W; the 0.2 Hz cap stretched the first burst so long that the node never slept."""

from __future__ import annotations

import re

import pytest
from support.governor_day import PROFILES

from models import bundled
from runtime.device.profiles import load_profile
from runtime.tools import simloop

SLEEP = "\n[sleep]\nenabled = true\nevery_s = 300\nburst = 2\nflush_timeout_s = 2.0\n"
STEP_DOWN = re.compile(r"rung (\d+)/(\d+) -> (\d+)/\d+")


def stretch(tmp_path, extra: str) -> simloop.LoopResult:
    """One simulated hour at 300x from 50 % charge; the camera offers 5 frames a simulated
    second (a burst takes under a second)."""
    return simloop.run(tmp_path, "solar-node", "cool", "step_wise", 1.0, 2.0, PROFILES,
                       speed=300.0, extra=extra, battery_frac=0.5, accuracy_floor=0.9,
                       source_hz=5 * 300.0, timeout_s=240)


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
@pytest.mark.timeout(600)
def test_sleeping_node_keeps_its_rung_and_the_awake_node_steps_down(tmp_path):
    cap = load_profile("solar-node").battery.capacity_wh
    asleep = stretch(tmp_path / "sleep", SLEEP)
    sim, sleep = asleep.simulated, asleep.health["sleep"]
    assert asleep.exit_code == 0, asleep.log[-2000:]
    # one rung all hour: the top one the daemon chose and started on, never stepped down
    assert not STEP_DOWN.search(asleep.log), STEP_DOWN.search(asleep.log)
    top = re.search(r"choice: (\S+): ", asleep.log)
    assert top and list(sim["rung_s"]) == [top.group(1)] and sim["rung_changes"] == 0, sim
    # the schedule delivered (12 periods; the last may still be awake) within the plan's budget
    assert sleep["mode"] == "sleep" and not sleep["over_budget"], sleep
    assert sleep["wakes"] >= 10, sleep
    used_wh = (0.5 - sim["battery_frac"]) * cap
    assert used_wh < 0.5, sim  # the awake floor alone is 1.2 Wh an hour
    assert sim["suspended_h"] > 0.7, sim

    awake = stretch(tmp_path / "awake", "")
    sim = awake.simulated
    assert awake.exit_code == 0, awake.log[-2000:]
    # unchanged without sleep: the energy budget at the idle floor plans 0 W: the cheapest rung
    m = STEP_DOWN.search(awake.log)
    assert m and m.group(3) == "1" and "plan 0.00 W" in awake.log, awake.log[-2000:]
    assert (0.5 - sim["battery_frac"]) * cap == pytest.approx(1.2, abs=0.02), sim
