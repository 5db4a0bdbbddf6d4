"""The ladder the governor climbs, built from profiles. Pure.

The top rung is the selector's choice (lowest energy meeting the latency target and the
accuracy floor); below it, the cheaper variants on the (accuracy, energy) frontier that still
meet the latency target: the governor trades accuracy below the operator's floor only to
protect the device. A rung's energy is *measured* (profiling, then kept current from the
running pipeline), never assumed from its precision. The rung vocabulary itself (`Rung`,
budget -> rung, the hold, `on_device`) is power/rungs.py: power owns it.
"""

from __future__ import annotations

from collections.abc import Sequence

from power.rungs import Rung
from runtime.choice.selector import Constraints, Profile, effective_accuracy, frontier, select


def ladder(profiles: Sequence[Profile], percentile: int = 95) -> list[Rung]:
    """The frontier as rungs, cheapest (index 0) to most accurate."""
    return [Rung(p.variant_id, effective_accuracy(p) or 0.0, p.energy_mj / 1e3,
                 p.latency(percentile) / 1e3) for p in frontier(profiles)]


def ladder_for(profiles: Sequence[Profile], c: Constraints) -> tuple[list[Rung], str]:
    """Rungs the governor may use (cheapest first) and the selector's reason (see module doc).
    Raises NoVariantError when nothing can run."""
    choice = select(profiles, c)
    meets = [p for p in profiles if p.ok and p.latency(c.percentile) <= c.latency_ms]
    rungs = [r for r in ladder(meets, c.percentile) if r.energy_j <= choice.profile.energy_mj / 1e3]
    top = ladder([choice.profile], c.percentile)[0]
    rungs = [r for r in rungs if r.variant_id != top.variant_id] + [top]
    reason = choice.reason
    if choice.profile.accuracy is None:
        reason += ("; accuracy unknown (no manifest: the fp32 form is the reference, taken "
                   "as 1.0)")
    if len(rungs) == 1:
        reason += "; a one-rung ladder: the governor can only cap the frame rate"
    return rungs, reason
