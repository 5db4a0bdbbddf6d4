"""The ladder the governor climbs, built from profiles. Pure.

The top rung is the selector's choice (lowest energy meeting the latency target and the
accuracy floor); below it, the cheaper variants on the (accuracy, energy) frontier that still
meet the latency target: the governor trades accuracy below the operator's floor only to
protect the device. A rung's energy is *measured* (profiling, then kept current from the
running pipeline), never assumed from its precision. The rung vocabulary itself (`Rung`,
budget -> rung, the hold, `on_device`) is power/rungs.py: power owns it.

When the top is chosen by the box (`Constraints.by_box`, runtime/choice/frame_cost.py), the rungs
below it are judged the same way: each variant in its best configuration (the preprocessing
path with the least box energy per frame among those meeting the same target the selector
used, keeping up with the offered rate), on the (accuracy, box energy per frame) frontier,
none above the top's box energy, cheapest box energy first. `Rung.energy_j` stays the
dynamic energy per inference (power/control.py adds the stages around it, `other_j`): only
which variants are rungs, and their order, follow the box. The path each rung was judged on
travels with the ladder (`Ladder.pre_paths`): the [model]'s preprocessing runs a rung on the
path its configuration was figured with (runtime/engine/preprocessing.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from power.rungs import Rung
from runtime.choice import at_rate
from runtime.choice.frame_cost import BoxFigure, configurations, energy_key
from runtime.choice.selector import (
    Choice,
    Constraints,
    Profile,
    box_costs,
    box_latency,
    effective_accuracy,
    frontier,
    inference_rate,
    meets_box,
    select,
)


@dataclass(frozen=True)
class Ladder:
    """Rungs the governor may use (cheapest first), why, and each rung's preprocessing."""

    rungs: list[Rung]
    reason: str
    # variant id -> the preprocessing path its configuration was judged on (cpu |
    # opencl:<device>); only rungs chosen by the box with a measured path have one
    pre_paths: dict[str, str] = field(default_factory=dict)


def ladder(profiles: Sequence[Profile], percentile: int = 95) -> list[Rung]:
    """The frontier as rungs, cheapest (index 0) to most accurate."""
    return [_rung(p, percentile) for p in frontier(profiles)]


def _rung(p: Profile, percentile: int) -> Rung:
    return Rung(p.variant_id, effective_accuracy(p) or 0.0, p.energy_mj / 1e3,
                p.latency(percentile) / 1e3)


def ladder_for(profiles: Sequence[Profile], c: Constraints) -> tuple[list[Rung], str]:
    """Rungs the governor may use (cheapest first) and the selector's reason (see module doc).
    Raises NoVariantError when nothing can run."""
    built = build_ladder(profiles, c)
    return built.rungs, built.reason


def build_ladder(profiles: Sequence[Profile], c: Constraints) -> Ladder:
    """The ladder for `c` (see module doc) with each rung's preprocessing path when the box
    chose it. Raises NoVariantError when nothing can run."""
    # every rung at the served rate, as the selector ranks (runtime/choice/at_rate.py)
    profiles = at_rate.served(profiles, inference_rate(c))
    choice = select(profiles, c)
    if c.by_box:
        rungs, paths = _box_rungs(profiles, c, choice)
    else:
        rungs, paths = _model_rungs(profiles, c, choice), {}
    reason = choice.reason
    if choice.profile.accuracy is None:
        reason += ("; accuracy unknown (no manifest: the fp32 form is the reference, taken "
                   "as 1.0)")
    if len(rungs) == 1:
        reason += "; a one-rung ladder: the governor can only cap the frame rate"
    return Ladder(rungs, reason, paths)


def _model_rungs(profiles: Sequence[Profile], c: Constraints, choice: Choice) -> list[Rung]:
    """Below the top: the frontier of variants whose inference meets `c.latency_ms`, none
    dearer per inference than the top."""
    meets = [p for p in profiles if p.ok and p.latency(c.percentile) <= c.latency_ms]
    rungs = [r for r in ladder(meets, c.percentile) if r.energy_j <= choice.profile.energy_mj / 1e3]
    top = _rung(choice.profile, c.percentile)
    return [r for r in rungs if r.variant_id != top.variant_id] + [top]


def _box_rungs(profiles: Sequence[Profile], c: Constraints, choice: Choice
               ) -> tuple[list[Rung], dict[str, str]]:
    """Below the top chosen by the box: the (accuracy, box energy per frame) frontier of the
    variants' best configurations meeting the selector's target, none dearer per frame than
    the top's; and the path of every rung."""
    costs = box_costs(c)
    top_id = choice.profile.variant_id
    # the accuracy floor's fallback carries no figure: the top runs its cheapest configuration
    top = choice.box or min(configurations(choice.profile, costs, c.percentile),
                            key=lambda f: (energy_key(f), f.pre_path))
    best: dict[str, tuple[Profile, BoxFigure]] = {}
    for p in profiles:
        if not p.ok or effective_accuracy(p) is None or math.isnan(p.energy_mj):
            continue
        fits = [f for f in configurations(p, costs, c.percentile) if meets_box(p, f, c)]
        if fits:
            best[p.variant_id] = (p, min(fits, key=lambda f: (
                energy_key(f), box_latency(p, f, c), f.pre_path)))
    best[top_id] = (choice.profile, top)  # as the selector figured it, met or not
    ordered = sorted((x for x in best.values() if energy_key(x[1]) <= energy_key(top)),
                     key=lambda x: (energy_key(x[1]), -(effective_accuracy(x[0]) or 0.0),
                                    box_latency(*x, c), x[0].variant_id))
    below: list[tuple[Profile, BoxFigure]] = []
    most = -math.inf
    for p, f in ordered:  # the frontier: each one more accurate than every cheaper one
        acc = effective_accuracy(p) or 0.0
        if acc > most:
            most = acc
            if p.variant_id != top_id:
                below.append((p, f))
    chain = [*below, (choice.profile, top)]
    rungs = [_rung(p, c.percentile) for p, _ in chain]
    return rungs, {p.variant_id: f.pre_path for p, f in chain if f.pre_path}
