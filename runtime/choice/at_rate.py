"""Energy per inference at the rate frames are served, not back to back. Pure: table-tested.

The profiler measures a variant back to back: every kernel right after the last. Served at a
cadence, an accelerator does not race to idle between frames: a GPU keeps its clocks and most
of its power for seconds after a kernel (the lent H200 drew 128-137 W against 81 W idle
serving 20 Hz at 3-4 % utilisation: ~2.3 J a frame against ~0.4 J measured back to back).
So a frame at rate r on an accelerator costs

    at-rate mJ = back-to-back mJ + gap_w x max(1/r - inference s, 0) x 1e3

where `gap_w` is the device's power above its idle floor in the gap after a kernel
(runtime/choice/accel_window.py measures it with the device's own meter; the profile says
how, `gap_source`). On the host CPU the gap costs nothing beyond the box's idle share (its
cores idle between frames; runtime/choice/frame_cost.py adds the idle share): unchanged. A variant
whose gap power is unknown keeps its back-to-back figure, labelled so.

`served` applies this to profiles for a rate (idempotent: a profile already at that rate is
left alone, one at another rate is recomputed from its back-to-back figure); the selector,
the ladder and the refinement's pruning all rank by it, and `label` says how each figure was
obtained. `drift` is the serving check: a variant whose energy measured while serving is
above its at-rate profile by more than the meter's error is re-ranked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

P = TypeVar("P")


def gap_s(p: Any, rate_hz: float) -> float:
    """Seconds a device sits between two inferences at `rate_hz` (inferences per second)."""
    if rate_hz <= 0 or not math.isfinite(rate_hz):
        return 0.0
    busy = p.p50_ms / 1e3 if p.p50_ms == p.p50_ms else 0.0
    return max(1.0 / rate_hz - busy, 0.0)


def per_inference_mj(p: Any, rate_hz: float) -> float:
    """Energy per inference at `rate_hz` (module doc); back to back at rate 0 or when the gap
    power is unknown."""
    base = p.back_to_back_mj if p.at_rate_hz and not math.isnan(p.back_to_back_mj) \
        else p.energy_mj
    if math.isnan(p.gap_w) or rate_hz <= 0:
        return base
    return base + p.gap_w * gap_s(p, rate_hz) * 1e3


def served(profiles: Sequence[P], rate_hz: float) -> list[P]:
    """`profiles` with `energy_mj` at `rate_hz` inferences per second where their gap power
    is known (back to back kept in `back_to_back_mj`); 0: all back to back again."""
    out = []
    for p in profiles:
        q: Any = p
        if not getattr(q, "ok", True) or q.at_rate_hz == rate_hz:
            out.append(p)
            continue
        b2b = q.back_to_back_mj if q.at_rate_hz else q.energy_mj
        if rate_hz <= 0:
            out.append(replace(q, energy_mj=b2b, at_rate_hz=0.0, back_to_back_mj=math.nan))
        elif not math.isnan(q.gap_w):
            out.append(replace(q, energy_mj=per_inference_mj(q, rate_hz), at_rate_hz=rate_hz,
                               back_to_back_mj=b2b))
        else:
            out.append(p)
    return out


def label(p: Any) -> str:
    """How a profile's energy figure was obtained, at its rate."""
    if not p.at_rate_hz:
        gap = (f"; gap power {p.gap_w:.1f} W ({p.gap_source})" if not math.isnan(p.gap_w)
               else "")
        return f"back to back ({p.energy_source}){gap}"
    return (f"at {p.at_rate_hz:g}/s: {p.back_to_back_mj:.3f} mJ back to back + "
            f"{p.gap_w:.1f} W in the gap x {gap_s(p, p.at_rate_hz) * 1e3:.1f} ms "
            f"({p.gap_source})")


def drift(profiled_mj: float, live_mj: float, error: float) -> str | None:
    """Why a variant's energy per inference measured while serving (`live_mj`) says its
    at-rate profile (`profiled_mj`) was wrong: above it by more than the meter's relative
    `error` (NaN: unknown, taken as the noise floor of 5 %); None when it agrees."""
    err = error if not math.isnan(error) and error > 0 else 0.05
    if not profiled_mj > 0 or math.isnan(live_mj):
        return None
    if live_mj > profiled_mj * (1 + err):
        return (f"serving costs {live_mj:.3f} mJ per inference against {profiled_mj:.3f} mJ "
                f"profiled at this rate (more than the meter's {err:.0%} error)")
    return None
