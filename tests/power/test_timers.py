"""Table tests for the control core's level timers (power/timers.py `pace`): the settle time,
the release dwell, its back-off against limit cycles and how it is forgotten."""

from __future__ import annotations

import math

import pytest

from power.governor import Decision
from power.timers import LevelTimers, pace

SETTLE, DWELL, MAX = 10.0, 30.0, 240.0


def ask(level: int, gate: str) -> Decision:
    return Decision(math.inf, level=level, reason="asked", gate=gate)  # type: ignore[arg-type]


def run(steps, timers=None, level=2):
    """Feed (t, asked level, gate) steps from `level`; the levels in force and the timers."""
    tm, got = timers or LevelTimers(), []
    for t, want, gate in steps:
        tm, level, _ = pace(tm, level, ask(want, gate), t, SETTLE, DWELL, MAX)
        got.append(level)
    return tm, got


PACE = [
    # name, timers before, steps (t, asked level, gate) from level 2, levels, dwell after
    ("a release waits the dwell since the last change", LevelTimers(last_change_t=0.0),
     [(10, 1, "dwell"), (29, 1, "dwell"), (30, 1, "dwell")], [2, 2, 1], DWELL),
    ("then one level per dwell", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (50, 0, "dwell"), (60, 0, "dwell")], [1, 1, 0], DWELL),
    ("a climb at once ignores the dwell", LevelTimers(last_change_t=0.0),
     [(1, 3, "up")], [3], DWELL),
    ("a creep waits the settle time since the last change", LevelTimers(last_change_t=0.0),
     [(5, 3, "settle"), (10, 3, "settle")], [2, 3], DWELL),
    ("a release undone within two dwells doubles the dwell", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (40, 2, "up")], [1, 2], 2 * DWELL),
    ("... once per release, not per step of the climb", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (40, 2, "up"), (41, 3, "up"), (52, 4, "settle")], [1, 2, 3, 4],
     2 * DWELL),
    ("a release that held two dwells keeps the dwell", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (91, 2, "up")], [1, 2], DWELL),
    ("... exactly two dwells is enough", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (90, 2, "up")], [1, 2], DWELL),
    ("the critical margin and fail-safe do not back it off", LevelTimers(last_change_t=0.0),
     [(30, 1, "dwell"), (31, 4, "now")], [1, 4], DWELL),
    ("the doubled dwell holds the next release back", LevelTimers(
        last_change_t=100.0, last_release_t=90.0, dwell_s=60.0),
     [(130, 1, "dwell"), (160, 1, "dwell")], [2, 1], 60.0),
    ("doubling stops at max_dwell_s", LevelTimers(
        last_change_t=0.0, last_release_t=0.0, dwell_s=MAX),
     [(10, 3, "up")], [3], MAX),
    ("forgotten 2 x max_dwell_s after the last release", LevelTimers(
        last_change_t=100.0, last_release_t=100.0, dwell_s=MAX),
     [(101 + 2 * MAX, 1, "dwell"), (102 + 2 * MAX, 0, "dwell")], [1, 1], DWELL),
    ("... and not before", LevelTimers(last_change_t=100.0, last_release_t=100.0, dwell_s=MAX),
     [(100 + 2 * MAX, 1, "dwell")], [1], MAX),
]


@pytest.mark.parametrize(("name", "timers", "steps", "want", "dwell"), PACE,
                         ids=[c[0] for c in PACE])
def test_pace(name, timers, steps, want, dwell):
    tm, got = run(steps, timers)
    assert got == want and tm.dwell_s == dwell


def test_a_release_is_recorded_and_says_its_dwell():
    tm, level, why = pace(LevelTimers(last_change_t=0.0), 2, ask(1, "dwell"), 30.0, SETTLE,
                          DWELL, MAX)
    assert (level, tm.last_change_t, tm.last_release_t) == (1, 30.0, 30.0)
    assert why == "asked for 30 s: release"
    tm, level, why = pace(tm, 1, ask(0, "dwell"), 40.0, SETTLE, DWELL, MAX)
    assert (level, why) == (1, "cool, waiting out the dwell before releasing")


def test_a_limit_cycle_backs_off_to_the_cap_then_a_quiet_spell_forgets_it():
    """Release, climb straight back, forever: the dwell doubles each time up to the cap; then
    cool and settled for 2 x max_dwell_s it is the configured dwell again."""
    tm, level, t = LevelTimers(last_change_t=0.0), 2, 0.0
    for _ in range(6):
        t += tm.dwell_s or DWELL
        tm, level, _ = pace(tm, level, ask(level - 1, "dwell"), t, SETTLE, DWELL, MAX)
        t += 1
        tm, level, _ = pace(tm, level, ask(level + 1, "up"), t, SETTLE, DWELL, MAX)
    assert tm.dwell_s == MAX and level == 2
    t += MAX
    tm, level, _ = pace(tm, level, ask(1, "dwell"), t, SETTLE, DWELL, MAX)
    assert level == 1 and tm.dwell_s == MAX
    tm, level, _ = pace(tm, level, ask(0, "dwell"), t + 2 * MAX + 1, SETTLE, DWELL, MAX)
    assert level == 0 and tm.dwell_s == DWELL
