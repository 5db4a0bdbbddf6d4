"""The control core's timers: every hold, dwell and back-off of power/control.py lives here,
and nowhere else (the policies in power/governor.py keep none, as Linux's step_wise keeps
none and the thermal core paces it). Pure; table-tested in tests/power/test_timers.py.

- **The level's pace** (`pace`): a thermal policy says which way (`Decision.level`) and its
  gate; a level up on a measured creep waits `settle_s` since the last change, a release
  waits the dwell since the last change. The dwell doubles (up to `max_dwell_s`) at the first
  climb after a release it did not outlast twice (the release was too early: a limit cycle),
  once per release undone, not per step of the climb; it is forgotten (back to `dwell_s`)
  2 x `max_dwell_s` after the last release.
- **The rung hold** (`hold`): a rung steps down at once and up one rung per dwell; a step down
  that undoes an upgrade younger than four dwells doubles the dwell (up to `max_dwell_s`);
  four dwells without a change bring it back.

Both take the dwell and its cap from the same settings (ControlConfig.dwell_s/max_dwell_s,
the [governor] section's dwell_s/max_dwell_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from power.governor import Decision


@dataclass(frozen=True)
class LevelTimers:
    """When the thermal level last changed and was last released, and the release dwell in
    force (None: the configured one; it backs off against limit cycles)."""

    last_change_t: float = -math.inf
    last_release_t: float = -math.inf
    dwell_s: float | None = None


def pace(timers: LevelTimers, level: int, asked: Decision, t: float, settle_s: float,
         dwell_s: float, max_dwell_s: float) -> tuple[LevelTimers, int, str]:
    """(timers, the level in force, why) after the policy asked for `asked.level` from
    `level` at device time `t`, paced by `asked.gate` (module doc)."""
    dwell = timers.dwell_s if timers.dwell_s is not None else dwell_s
    if t - timers.last_release_t > 2 * max_dwell_s:
        dwell = dwell_s  # long settled: forget the back-off
    want, why = asked.level, asked.reason
    if asked.gate == "settle" and t - timers.last_change_t < settle_s:
        want, why = level, "holding"
    elif asked.gate == "dwell":
        if t - timers.last_change_t >= dwell:
            why = f"{why} for {dwell:.0f} s: release"
        else:
            want, why = level, "cool, waiting out the dwell before releasing"
    if (asked.gate in ("up", "settle") and want > level
            and t - timers.last_release_t < 2 * dwell
            and timers.last_change_t <= timers.last_release_t):
        # the last release was too early: doubled once for it, at the first step up after
        # it (not at each step of the same climb)
        dwell = min(2 * dwell, max_dwell_s)
    timers = replace(timers, dwell_s=dwell)
    if want != level:
        timers = replace(timers, last_change_t=t, last_release_t=(
            t if asked.gate == "dwell" else timers.last_release_t))
    return timers, want, why


@dataclass(frozen=True)
class RungHold:
    """What the rung hold remembers: when the rung last changed and how long an upgrade
    must wait now (doubles when an upgrade is undone within its dwell: no limit cycles)."""

    rung: int | None = None
    last_change_t: float = -math.inf
    last_up_t: float = -math.inf
    dwell_s: float | None = None


def hold(state: RungHold, proposed: int, t: float, base_dwell_s: float,
         max_dwell_s: float = 900.0) -> RungHold:
    """Step down at once; step up one rung only after the dwell. A step down that undoes an
    upgrade younger than four dwells doubles the dwell (up to `max_dwell_s`): the upgrade did
    not hold, so the next one waits longer. Four dwells without a change bring it back to
    `base_dwell_s`."""
    dwell = state.dwell_s if state.dwell_s is not None else base_dwell_s
    if state.rung is None:
        return RungHold(proposed, t, -math.inf, dwell)
    if t - state.last_change_t >= 4 * dwell:
        dwell = base_dwell_s
    if proposed < state.rung:
        if t - state.last_up_t < 4 * dwell:
            dwell = min(max_dwell_s, dwell * 2)
        return RungHold(proposed, t, state.last_up_t, dwell)
    if proposed > state.rung and t - state.last_change_t >= dwell:
        return RungHold(state.rung + 1, t, t, dwell)
    return replace(state, dwell_s=dwell)
