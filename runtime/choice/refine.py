"""Which variants a fast cold start keeps measuring, and for how long. Pure: tested with tables.

A cold start measures every variant briefly (the quick round), serves on the selector's choice
from those numbers, and then measures again, longer each round, only the variants that could
still matter: those that could be the selector's choice, or a rung of the governor's ladder
below it, once their measurements are exact. Everything else is pruned (racing / successive
halving: each round is `ROUND_GROWTH` times longer than the one before, the last one is the
profiler's full length, so a survivor ends up measured exactly as an exhaustive run would).

"Could" is judged with each measurement's confidence: a profile carries `energy_ci` and
`latency_ci`, relative half-widths of ~95 % intervals from its own spread (`mean_ci`,
`percentile_ci`), and every comparison adds
`NOISE_FLOOR` on top for what a single run cannot see (another process taking the cache for a
while on a shared machine). A variant is pruned only when, at its most optimistic, it is still
dearer than another variant at its most pessimistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from runtime.choice import at_rate
from runtime.choice.frame_cost import configurations
from runtime.choice.selector import (
    AUTO_TOLERANCE,
    Constraints,
    NoVariantError,
    Profile,
    box_costs,
    box_latency,
    box_target,
    effective_accuracy,
    inference_rate,
    keeps_up,
    select,
)

NOISE_FLOOR = 0.05  # run-to-run variation of a measurement that its own spread does not show
ROUND_GROWTH = 4  # each refinement round measures this many times longer than the last
ROUNDS = 3  # quick (1/16 of the full length), 1/4, full
FINALISTS = 4  # at most this many near-ties are measured again at the end (`finalists`)


@dataclass(frozen=True)
class RoundSettings:
    """How long one round measures each variant (the profiler's own knobs, scaled)."""

    warmup_runs: int
    min_runs: int
    max_runs: int
    time_budget_s: float
    final: bool  # the profiler's full length: a survivor's profile is then a full profile


def rounds(warmup_runs: int, min_runs: int, max_runs: int, time_budget_s: float,
           n: int = ROUNDS, growth: int = ROUND_GROWTH) -> list[RoundSettings]:
    """The schedule: `n` rounds, each `growth` times longer than the last, the last exactly
    the configured full length. Never fewer than 3 timed runs (a spread needs samples) and at
    least one warm-up run (the first inference after a load allocates)."""
    out = []
    for r in range(n):
        f = float(growth) ** (r - (n - 1))
        if r == n - 1:
            out.append(RoundSettings(warmup_runs, min_runs, max_runs, time_budget_s, True))
            continue
        lo = min(min_runs, max(3, math.ceil(min_runs * f)))
        out.append(RoundSettings(max(1, math.ceil(warmup_runs * f)), lo,
                                 max(lo, math.ceil(max_runs * f)), time_budget_s * f, False))
    return out


def mean_ci(samples_ms: Sequence[float]) -> float:
    """Relative half-width of a ~95 % interval for the mean of the samples (energy per
    inference is a mean: CPU time or metered energy over n runs, each run's cost following its
    latency). Infinite with < 2 samples."""
    n = len(samples_ms)
    if n < 2:
        return math.inf
    mean = sum(samples_ms) / n
    if mean <= 0:
        return math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in samples_ms) / (n - 1))
    return 1.96 * sd / mean / math.sqrt(n)


def percentile_ci(samples_ms: Sequence[float], percentile: int = 95) -> float:
    """Relative half-width of a ~95 % interval for a latency percentile: the distribution-free
    order-statistic interval; where there are too few samples to bound the tail above, the
    largest sample plus one standard deviation per missing rank and one more, for what was not
    seen. Infinite with < 2 samples."""
    n = len(samples_ms)
    if n < 2:
        return math.inf
    xs = sorted(samples_ms)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    q = percentile / 100
    centre = q * (n - 1)
    half = 1.96 * math.sqrt(n * q * (1 - q))
    lo_i, hi_i = math.floor(centre - half), math.ceil(centre + half)
    lo_v = xs[max(lo_i, 0)]
    hi_v = xs[min(hi_i, n - 1)] + (sd * (hi_i - n + 2) if hi_i > n - 1 else 0.0)
    point = xs[min(round(centre), n - 1)]
    return (hi_v - lo_v) / 2 / point if point > 0 else math.inf


def _bounds(value: float, ci: float, floor: float) -> tuple[float, float]:
    """(optimistic, pessimistic) value: the interval plus the noise floor. An unknown interval
    (NaN: a profile from an older cache or a recording) counts as wide open."""
    m = min((math.inf if math.isnan(ci) else ci) + floor, 0.95)  # below 0 says no more
    return value * (1 - m), value * (1 + m)


Bounds = tuple[float, float]  # (optimistic, pessimistic)


def judged(p: Profile, c: Constraints, floor: float = NOISE_FLOOR) -> tuple[Bounds, Bounds]:
    """(latency, energy) bounds of `p` as the selector judges it (module doc): inference
    latency at the percentile and energy per inference; by the box, the best configuration's
    latency that the target bounds (infinite when it cannot keep up with the offered rate)
    and its box energy per frame, each figured at the optimistic and at the pessimistic end
    of the measurement's intervals."""
    lat = _bounds(p.latency(c.percentile), p.latency_ci, floor)
    en = _bounds(p.energy_mj, p.energy_ci, floor)
    if not c.by_box:
        return lat, en
    scale = [x / p.latency(c.percentile) if p.latency(c.percentile) > 0 else 1.0 for x in lat]
    ends = []
    for k in (0, 1):  # optimistic, pessimistic: faster and cheaper, slower and dearer
        ends.append(_best(replace(p, energy_mj=en[k], p50_ms=p.p50_ms * scale[k],
                                  p95_ms=p.p95_ms * scale[k], p99_ms=p.p99_ms * scale[k]), c))
    return (ends[0][0], ends[1][0]), (ends[0][1], ends[1][1])


def _best(q: Profile, c: Constraints) -> tuple[float, float]:
    """(the least latency the target bounds, infinite for a configuration that cannot keep
    up; the least box mJ/frame of a configuration meeting the target, of any when none does)
    over `q`'s configurations: a cheaper path that misses the target is not a figure the
    selector could run it at."""
    costs, target = box_costs(c), box_target(c)[0]
    late = [(box_latency(q, f, c) if keeps_up(f, costs) else math.inf, f)
            for f in configurations(q, costs, c.percentile)]
    fits = [f for t, f in late if t <= target] or [f for _, f in late]
    return min(t for t, _ in late), min(f.box_mj for f in fits)


def _energy(p: Profile, c: Constraints) -> float:
    """The energy the selector ranks `p` by, as measured: per inference, or by the box per
    frame of its best configuration (`_best`)."""
    return _best(p, c)[1] if c.by_box else p.energy_mj


def _target(c: Constraints) -> float:
    """The latency the selector's target bounds (`judged`'s latency is against it)."""
    return box_target(c)[0] if c.by_box else c.latency_ms


def keep(profiles: Sequence[Profile], c: Constraints, floor: float = NOISE_FLOOR) -> set[str]:
    """Variant ids worth measuring longer: every variant that, within its confidence, could be
    the selector's choice (cheapest meeting the latency target at the accuracy floor, or the
    fastest when none surely meets it) or a ladder rung below it (on the accuracy/energy
    frontier, meeting the target, no dearer than the choice). Failed variants and those of
    unknown accuracy are never kept: the selector cannot pick them. Pure."""
    profiles = at_rate.served(profiles, inference_rate(c))  # ranked as the selector ranks
    known = [p for p in profiles if p.ok and effective_accuracy(p) is not None
             and not math.isnan(p.energy_mj)]
    if not known:
        return set()
    acc = {p.variant_id: effective_accuracy(p) for p in known}
    floor_acc = c.accuracy_floor
    if floor_acc is None:
        floor_acc = max(acc.values()) - AUTO_TOLERANCE  # type: ignore[type-var]
    bounds = {p.variant_id: judged(p, c, floor) for p in known}
    lat = {vid: b[0] for vid, b in bounds.items()}
    en = {vid: b[1] for vid, b in bounds.items()}
    target = _target(c)
    eligible = [p for p in known if acc[p.variant_id] >= floor_acc]  # type: ignore[operator]
    if not eligible:  # the selector runs the most accurate: accuracy is exact, keep the ties
        top = max(acc.values())  # type: ignore[type-var]
        return {p.variant_id for p in known if acc[p.variant_id] == top}
    could = [p for p in eligible if lat[p.variant_id][0] <= target]
    surely = [p for p in eligible if lat[p.variant_id][1] <= target]
    out: set[str] = set()
    if not surely:
        # Maybe none meets the target: the selector would run the fastest. Keep every variant
        # that could be the fastest.
        fastest_hi = min(lat[p.variant_id][1] for p in eligible)
        out |= {p.variant_id for p in eligible if lat[p.variant_id][0] <= fastest_hi}
        if not could:
            return out
    # The choice costs at most this much (a variant surely meeting the target, pessimistic).
    cap = min(en[p.variant_id][1] for p in surely) if surely else math.inf
    out |= {p.variant_id for p in could if en[p.variant_id][0] <= cap}
    # Rungs below the choice: any variant that could meet the target, could be cheaper than
    # the choice, and is not surely dominated (another, surely meeting the target, at least
    # as accurate and surely cheaper).
    meet_any = [p for p in known if lat[p.variant_id][0] <= target]
    meet_sure = [p for p in known if lat[p.variant_id][1] <= target]
    for p in meet_any:
        lo = en[p.variant_id][0]
        if lo > cap or p.variant_id in out:
            continue
        dominated = any(q.variant_id != p.variant_id and acc[q.variant_id] >= acc[p.variant_id]
                        and en[q.variant_id][1] < lo for q in meet_sure)
        if not dominated:
            out.add(p.variant_id)
    return out


def first_decision_ready(profiles: Sequence[Profile], forms: Sequence[str], c: Constraints,
                         elapsed_s: float, wait_s: float) -> bool:
    """Whether the quick round may stop and serve (the rest of it runs in the background):
    `wait_s` has passed, every model form in `forms` has a variant that ran (so the automatic
    accuracy floor knows the most accurate form), and the selector's choice among these meets
    the latency target and the accuracy floor. Pure."""
    if elapsed_s < wait_s:
        return False
    ran = {p.model for p in profiles if p.ok}
    if not set(forms) <= ran:
        return False
    try:
        return select(profiles, c).met
    except NoVariantError:
        return False


def observed_floor(pairs: Sequence[tuple[Profile, Profile]], floor: float = NOISE_FLOOR,
                   cap: float = 0.5) -> float:
    """The noise floor the data show: for variants measured in two rounds (earlier, later), how
    far the earlier energy was from the later one beyond the earlier one's own interval; the
    90th percentile of that, never below `floor` (nor above `cap`). On a quiet machine this
    stays at `floor`; on a busy one (other processes taking the CPU for seconds at a time)
    it widens every comparison, so fewer variants are pruned on a noisy number. Pure."""
    excess = []
    for old, new in pairs:
        if not (old.ok and new.ok) or not new.energy_mj > 0 or math.isnan(old.energy_mj):
            continue
        ci = 0.0 if math.isnan(old.energy_ci) else old.energy_ci
        excess.append(max(abs(old.energy_mj / new.energy_mj - 1) - ci, 0.0))
    if len(excess) < 3:  # too few to say anything about the machine
        return floor
    excess.sort()
    q90 = excess[min(len(excess) - 1, math.ceil(0.9 * len(excess)) - 1)]
    return min(max(floor, q90), cap)


def finalists(profiles: Sequence[Profile], c: Constraints, floor: float = NOISE_FLOOR,
              n: int = FINALISTS) -> list[str]:
    """Variant ids to measure again before the final choice: the selector's choice and the
    variants that, measured at full length, could still be the choice within the noise band
    (eligible, could meet the latency target, optimistic energy no higher than the choice's
    pessimistic one), closest in energy first, at most `n`. One full-length measurement of
    each decides between near-ties by noise (on a busy machine the same variant measured
    twice differs by more than the gap), so these get a second one, interleaved, and are
    compared on the combined numbers (`combine`). Empty when there is nothing to settle:
    one candidate, a choice not measured at full length, or no variant meeting the target.
    Pure."""
    profiles = at_rate.served(profiles, inference_rate(c))
    try:
        sel = select(profiles, c)
    except NoVariantError:
        return []
    choice = sel.profile
    if not sel.met or choice.stage != "full":
        return []
    ok = [p for p in profiles if p.ok and p.stage == "full"
          and effective_accuracy(p) is not None and not math.isnan(p.energy_mj)]
    accs = [a for p in profiles if p.ok and (a := effective_accuracy(p)) is not None]
    if not ok or not accs:
        return []
    floor_acc = c.accuracy_floor
    if floor_acc is None:
        floor_acc = max(accs) - AUTO_TOLERANCE
    cap = judged(choice, c, floor)[1][1]
    target = _target(c)
    near = [p for p in ok if p.variant_id != choice.variant_id
            and effective_accuracy(p) >= floor_acc  # type: ignore[operator]
            and (b := judged(p, c, floor))[0][0] <= target and b[1][0] <= cap]
    if not near:
        return []
    at = _energy(choice, c)
    near.sort(key=lambda p: abs(_energy(p, c) - at))
    return [choice.variant_id] + [p.variant_id for p in near[:n - 1]]


def combine(a: Profile, b: Profile) -> Profile:
    """Two full-length measurements of one variant as one: run-weighted means of energy,
    CPU time and latency percentiles; each interval the wider of what the two intervals give
    for the mean and half the gap between the two values (what a second measurement shows
    about run-to-run noise). A failed second measurement leaves the first. Pure."""
    if not b.ok:
        return a
    if not a.ok:
        return b
    n = a.runs + b.runs
    wa, wb = (a.runs / n, b.runs / n) if n else (0.5, 0.5)

    def mix(x: float, y: float) -> float:
        return wa * x + wb * y

    def ci(x: float, cx: float, y: float, cy: float) -> float:
        m = mix(x, y)
        if not m > 0:
            return math.inf
        cx = math.inf if math.isnan(cx) else cx
        cy = math.inf if math.isnan(cy) else cy
        pooled = math.sqrt((wa * x * cx) ** 2 + (wb * y * cy) ** 2) / m
        return max(pooled, abs(x - y) / 2 / m)

    return replace(a, runs=n, energy_mj=mix(a.energy_mj, b.energy_mj),
                   cpu_ms=mix(a.cpu_ms, b.cpu_ms), p50_ms=mix(a.p50_ms, b.p50_ms),
                   p95_ms=mix(a.p95_ms, b.p95_ms), p99_ms=mix(a.p99_ms, b.p99_ms),
                   energy_ci=ci(a.energy_mj, a.energy_ci, b.energy_mj, b.energy_ci),
                   latency_ci=ci(a.p95_ms, a.latency_ci, b.p95_ms, b.latency_ci))
