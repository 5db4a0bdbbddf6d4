"""A quick round's accelerator figure is provisional. Pure: table-tested.

A quick round measures each variant for a fraction of the full length. On the host CPU that
is a fair first figure; on an accelerator the device's meter may not have moved enough in
that window (NVML's counter steps every ~100 ms; power/meter_resolution.py), and the same
variant read 31.8 mJ quick and 393 mJ refined on the lent H200. The profiler sizes
accelerator windows to the meter now, but a meter whose resolution could not be measured, or
a window cut short, still leaves a wide interval (`energy_ci` includes the meter's
quantisation error). So when the selector's pick is an accelerator variant measured only in
a quick round, and a host-CPU candidate's interval overlaps its interval, the host-CPU
candidate is chosen until the refinement settles it: a provisional figure never decides
against a CPU figure it cannot be told apart from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from power.accelerators import on_host

T = TypeVar("T")


def provisional(p: Any) -> bool:
    """Whether `p`'s energy is a quick round's figure on an accelerator."""
    return p.stage == "quick" and not on_host(p.actual_device or p.device)


def bounds(energy: float, ci: float) -> tuple[float, float]:
    """(low, high) of an energy figure with relative half-width `ci` (NaN: wide open)."""
    m = ci if ci == ci else math.inf
    return energy * max(1 - m, 0.0), energy * (1 + m)


def settle(best: T, candidates: Sequence[T], profile: Callable[[T], Any],
           energy: Callable[[T], float]) -> tuple[T, str]:
    """`best`, or the cheapest host-CPU candidate whose interval overlaps it when `best` is a
    provisional accelerator figure (module doc); and a note saying so ("" when unchanged)."""
    p = profile(best)
    if not provisional(p):
        return best, ""
    _lo, hi = bounds(energy(best), p.energy_ci)
    host = [c for c in candidates if on_host(profile(c).actual_device or profile(c).device)
            and bounds(energy(c), profile(c).energy_ci)[0] <= hi]
    if not host:
        return best, ""
    pick = min(host, key=energy)
    return pick, (f"; {p.variant_id} ({energy(best):.3f} mJ) is a provisional quick-round "
                  f"figure on an accelerator and its interval overlaps the host CPU's: "
                  f"running on the CPU until the refinement settles it")
