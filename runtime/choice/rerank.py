"""Re-ranking while serving: when the energy a variant costs as served says its profile was
wrong, the measured figure replaces the profiled one and the choice is made again. Pure:
table-tested.

The profile's at-rate figure (runtime/choice/at_rate.py) is a model: back to back + the
device's gap power x the gap. It can be wrong: the gap power measured right after a burst is
not what a GPU keeps at a steady cadence (its clock governor decides on the load's history),
or it was not measured at all (the meter did not move; then the back-to-back figure stands).
The lent H200 served 20 Hz at ~2.3 J a frame, six times the figure its choice was made on.

Serving measures it: the accelerator's own meter over a window of frames
(runtime/device/serving_drift.py) gives the live energy per inference at the rate actually
served. `check` compares it with the profile's figure at that rate (`at_rate.drift`: above
it by more than the meter's error) and says what replaces what: the profile's gap power
becomes the one the live figure implies (so at any rate the profile now says what serving
measured), labelled "measured while serving"; with no gap (a backlog) the back-to-back
figure itself is replaced. The daemon then re-runs the choice on the profiles with the
replacement (the path a background re-profile's result takes) and says so with one event.

At most one re-rank per variant every `every_s` (`[daemon] rerank_every_s`): a live figure
that stays above every profile must not re-run the choice at every window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from runtime.choice import at_rate

MEASURED = "measured while serving"  # how a replaced figure is labelled (gap_source)


@dataclass(frozen=True)
class Drift:
    """A variant whose served energy exceeds its profile's: the figures, the meter's error,
    why, and the profile to re-rank with."""

    variant_id: str
    rate_hz: float  # inferences per second served over the window
    profiled_mj: float  # the profile's energy per inference at that rate
    live_mj: float  # measured while serving, per inference
    error: float  # the meter's relative error over the window (NaN: unknown, 5 % taken)
    why: str
    replacement: Any  # the Profile with the measured figure


def replaced(p: Any, rate_hz: float, live_mj: float, error: float) -> Any:
    """`p` (back to back, as profiled or as `at_rate.served` made it) with its energy at
    `rate_hz` the measured `live_mj`: its gap power the one that figure implies where there is
    a gap at that rate, else its back-to-back figure; labelled MEASURED either way."""
    b2b = p.back_to_back_mj if p.at_rate_hz and not math.isnan(p.back_to_back_mj) \
        else p.energy_mj
    base = replace(p, energy_mj=b2b, at_rate_hz=0.0, back_to_back_mj=math.nan)
    gap = at_rate.gap_s(p, rate_hz)
    how = (f"{MEASURED} at {rate_hz:.3g}/s: {live_mj:.3f} mJ per inference against "
           f"{at_rate.per_inference_mj(p, rate_hz):.3f} mJ profiled")
    err = error if error == error else math.nan
    if gap > 0 and live_mj > b2b:
        return replace(base, gap_w=(live_mj - b2b) / (gap * 1e3), gap_source=how,
                       energy_q=err)
    # no gap to put it in (a backlog, or a variant slower than the rate): the back-to-back
    # figure was wrong itself
    return replace(base, energy_mj=live_mj, energy_source=f"{p.energy_source}; {how}",
                   energy_q=err)


def check(p: Any, rate_hz: float, live_mj: float, error: float) -> Drift | None:
    """The drift of variant `p` served at `rate_hz` inferences/s at `live_mj` per inference,
    measured with relative `error`; None when it agrees with its profile (`at_rate.drift`),
    or when either figure is missing."""
    if p is None or not p.ok or not math.isfinite(live_mj) or live_mj <= 0 \
            or not rate_hz > 0 or not math.isfinite(rate_hz):
        return None
    profiled = at_rate.per_inference_mj(
        replace(p, at_rate_hz=0.0, energy_mj=p.back_to_back_mj, back_to_back_mj=math.nan)
        if p.at_rate_hz and not math.isnan(p.back_to_back_mj) else p, rate_hz)
    why = at_rate.drift(profiled, live_mj, error)
    if why is None:
        return None
    return Drift(p.variant_id, rate_hz, profiled, live_mj, error, why,
                 replaced(p, rate_hz, live_mj, error))


def due(last: dict[str, float], variant_id: str, now: float, every_s: float) -> bool:
    """Whether `variant_id` may be re-ranked at `now` (monotonic s): never, or at least
    `every_s` after its last re-rank (`last`, by variant id, which the caller keeps)."""
    t = last.get(variant_id)
    return t is None or now - t >= every_s


def swap(profiles: list, r: Any) -> list:
    """`profiles` with the one of `r`'s variant replaced by `r`."""
    return [r if q.variant_id == r.variant_id else q for q in profiles]
