"""The rung vocabulary: a rung, budget -> rung and a rung on a device. Pure.

A rung is one step of the ladder the governor climbs (runtime/choice/ladders.py builds the
ladder from profiles): a variant with its measured dynamic energy per inference and its
latency, and (`other_j`) the energy the stages around that inference cost (decode,
preprocessing, persisting; power/box_energy.py) where they are known. Everything here is
arithmetic on rungs, shared by the governor (power/control.py), the closed-loop simulator
and the daemon; power/ imports nothing of runtime/.

Budgets are in box watts: what the whole box may draw, its idle floor (`floor_w`) included.
A rung fits a budget when floor + its dynamic power (model and other stages) at the rate
does; with floor_w = 0 (the default) the figures are the dynamic power alone, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from power.device import PowerModel


@dataclass(frozen=True)
class Rung:
    """One ladder step: a frontier variant with its dynamic energy and latency."""

    variant_id: str
    accuracy: float
    energy_j: float  # dynamic energy per inference (idle excluded)
    latency_s: float
    parallel: int = 1  # sessions running side by side (one per core on a multi-core device)
    other_j: float = 0.0  # the stages around one inference (0: not known, or not counted)

    def max_rate_hz(self) -> float:
        """Back-to-back inferences per second."""
        return self.parallel / self.latency_s

    def work_j(self) -> float:
        """Dynamic energy of one inference and the stages around it."""
        return self.energy_j + self.other_j

    def power_w(self, rate_hz: float) -> float:
        """Dynamic power at a rate (capped at what the rung can sustain)."""
        return self.work_j() * min(rate_hz, self.max_rate_hz())

    def box_w(self, rate_hz: float, floor_w: float = 0.0) -> float:
        """What the box draws running this rung at a rate: the floor + the dynamic power."""
        return floor_w + self.power_w(rate_hz)

    def rate_for(self, budget_w: float, floor_w: float = 0.0) -> float:
        """The rate a budget of box watts allows this rung (inf: it costs nothing)."""
        work = self.work_j()
        return max(budget_w - floor_w, 0.0) / work if work > 0 else math.inf


def on_device(rungs: Sequence[Rung], cpu_s: Sequence[float], power: PowerModel) -> list[Rung]:
    """Rungs measured on this host as they would run on a device with power model `power`
    (power/device.py): latency and CPU time scaled by its `perf_scale`, energy =
    CPU-seconds x `active_w_per_core`, one session per core."""
    return [replace(r, latency_s=r.latency_s * power.perf_scale,
                    energy_j=c * power.perf_scale * power.active_w_per_core,
                    parallel=power.cores)
            for r, c in zip(rungs, cpu_s, strict=True)]


def with_other(rungs: Sequence[Rung], other_j: float | None) -> list[Rung]:
    """The rungs with the stages around their inference costing `other_j` each (J per
    frame, for rungs per frame; None: not measured, the rungs as they are)."""
    if other_j is None:
        return list(rungs)
    return [replace(r, other_j=other_j) for r in rungs]


# The cheapest rung's rates below its full rate, as shares of it: four steps per halving
# (2^-1/4 apart, ~16 % each) down to 1/32. Halvings alone (1/2, 1/4, 1/8) threw half the rate
# away wherever the cheapest rung at full rate was a little over what the device sustains: on
# a narrow ladder step_wise then delivered less than the cheapest rung run unmanaged
# (rpi5/hot, 0.63x kernel-only against 1.11x). Like cpufreq's cooling states,
# small steps let it settle near the sustainable power. Down to 1/32, not 1/8: where idle
# alone comes near the trip (rpi5/sun at 13:00) the step from 1/8 to minimum duty gave away
# what the hindsight oracle serves there (0.921 -> 0.953 of it).
RATE_STEPS = tuple(2 ** (-k / 4) for k in range(1, 21))


def budget_levels(rungs: Sequence[Rung], rate_hz: float, min_rate_hz: float = 0.0,
                  floor_w: float = 0.0) -> tuple[float, ...]:
    """step_wise's budget per level, in box watts (`floor_w` + dynamic): level 0
    unrestricted, then each rung below the top at full rate, then the cheapest rung at each
    of RATE_STEPS of the rate (0.84, 0.71, 0.59, 1/2, ... 1/32), and last at the minimum duty
    `min_rate_hz` (the bottom: fail-safe, and where a device that stays hot ends up)."""
    levels = [math.inf] + [r.box_w(rate_hz, floor_w) for r in reversed(rungs[:-1])]
    # only the steps above minimum duty: one below it would run at minimum duty anyway (a
    # level that changes nothing costs a settle_s on the way down and a dwell on the way up)
    levels += [floor_w + rungs[0].power_w(rate_hz) * k for k in RATE_STEPS
               if rate_hz * k > min_rate_hz]
    return (*levels, rungs[0].box_w(min(min_rate_hz, rate_hz), floor_w))


def select_for_budget(rungs: Sequence[Rung], budget_w: float, rate_hz: float,
                      current: int | None = None, up_margin: float = 0.1,
                      floor_w: float = 0.0) -> tuple[int, float]:
    """(rung index, rate): the most accurate rung whose box power at `rate_hz` (`floor_w`
    + its dynamic power) fits the budget of box watts.

    Moving up to a more accurate rung than `current` needs `up_margin` of headroom on its
    dynamic power (the floor is drawn whatever runs), so a budget hovering at a threshold
    does not flap. If even the cheapest rung does not fit, it runs at the rate the budget
    allows (possibly 0; the caller applies minimum duty).
    """
    fits = [i for i, r in enumerate(rungs) if r.box_w(rate_hz, floor_w) <= budget_w]
    if not fits:
        rate = rungs[0].rate_for(budget_w, floor_w)
        return 0, max(0.0, min(rate_hz, rate))
    best = max(fits)
    if current is not None and best > current:
        roomy = [i for i in fits if i <= current
                 or floor_w + rungs[i].power_w(rate_hz) * (1 + up_margin) <= budget_w]
        # Nothing at or below `current` fits and nothing has the margin (live energies need
        # not rise with the index): a forced move, to the fitting rung with the most headroom.
        best = max(roomy) if roomy else min(fits, key=lambda i: rungs[i].power_w(rate_hz))
    return best, rate_hz


