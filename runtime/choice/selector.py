"""Pure choice of a variant from measured profiles. No I/O, no clocks: tested with tables.

Nothing here assumes that a lower precision costs less: every decision reads the measured
energy per inference and latency of each variant.

Two ways to judge a variant, by what `Constraints` carries:
- the model alone (no `frame`, no `end_to_end_ms`; what every earlier config meant): lowest
  energy per inference among variants whose inference latency at the percentile is within
  `latency_ms`;
- the box (`frame`, the measured cost of the stages around inference, and/or
  `end_to_end_ms`): every configuration (a variant with a preprocessing path for its form,
  runtime/choice/frame_cost.py) ranked by the box's energy per frame, judged on its end-to-end
  latency (frame in to durable result) against `end_to_end_ms` when that is set, else on
  inference latency against `latency_ms`. Inference latency stays in the reason and in
  `Choice.box` as a reported figure.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from runtime.choice import at_rate, provisional
from runtime.choice.frame_cost import BoxFigure, FrameCosts, configurations, describe, energy_key
from runtime.config.constraints import Constraints  # the one type: config, commands, here


@dataclass(frozen=True)
class Profile:
    """What was measured for one variant on this device."""

    variant_id: str
    model: str
    precision: str
    engine: str
    device: str  # requested device id
    threads: int
    status: str = "ok"  # ok | failed | refused (the device cannot run the engine at all)
    error: str = ""
    actual_device: str = ""
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    p99_ms: float = math.nan
    runs: int = 0
    energy_mj: float = math.nan  # per inference, idle baseline subtracted
    energy_source: str = ""  # rapl | hwmon | battery | estimated
    cpu_ms: float = math.nan  # process CPU time per inference
    accuracy: float | None = None  # from the ladder manifest
    options: dict[str, str] = field(default_factory=dict)
    # How far it was measured: full (the profiler's full length), quick or refined (a fast
    # cold start's shorter rounds, runtime.choice.refine), known-failure (skipped: a cached failure)
    stage: str = "full"
    # relative half-widths of ~95 % intervals from the samples' spread (runtime.choice.refine)
    energy_ci: float = math.nan  # of the energy per inference (a mean)
    latency_ci: float = math.nan  # of the p95 latency
    # accelerators: W above the device's idle floor in the gap after a kernel,
    # which a frame at a cadence pays for the gap's length (runtime/choice/at_rate.py), and
    # how it was obtained; NaN on the host CPU (its cores idle between frames) or unknown
    gap_w: float = math.nan
    gap_source: str = ""
    energy_q: float = math.nan  # the meter's quantisation error of energy_mj (relative)
    # set by runtime/choice/at_rate.py: energy_mj is per inference at this rate (0: back to
    # back, as measured) and the back-to-back figure it was derived from
    at_rate_hz: float = 0.0
    back_to_back_mj: float = math.nan

    @property
    def ok(self) -> bool:
        """True when the variant loaded and ran."""
        return self.status == "ok"

    def latency(self, percentile: int) -> float:
        """Latency in ms at 50, 95 or 99."""
        return {50: self.p50_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]


STATUSES = ("ok", "failed", "refused")
_NUMBER = (int, float)
# what each annotation of Profile admits (bool is an int to Python, never a figure here)
_ADMITS: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": _NUMBER, "float | None": (*_NUMBER, type(None)),
    "dict[str, str]": (dict,),
}


def profile_from_dict(d: Any) -> Profile:
    """A Profile from a JSON object (a cache entry, a recorded profile file), every field of
    the type Profile declares and `status` one this code writes; ValueError naming the first
    field that is not (a damaged cache entry used to crash the selector with a TypeError).
    Keys Profile does not have are refused too (TypeError, as Profile(**d) says)."""
    if not isinstance(d, dict):
        raise ValueError(f"not a JSON object but {type(d).__name__}")
    for f in fields(Profile):
        if f.name not in d:
            continue
        v = d[f.name]
        if isinstance(v, bool) or not isinstance(v, _ADMITS[str(f.type)]):
            raise ValueError(f"{f.name} is {v!r}, not {f.type}")
    opts = d.get("options", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in opts.items()):
        raise ValueError(f"options is {opts!r}, not dict[str, str]")
    if d.get("status", "ok") not in STATUSES:
        raise ValueError(f"status is {d['status']!r}, not one of {', '.join(STATUSES)}")
    return Profile(**d)


AUTO_TOLERANCE = 0.02  # what the automatic floor gives up, at most, against the best variant


@dataclass(frozen=True)
class Choice:
    """The variant picked, whether it meets the constraints, and why, in one line."""

    profile: Profile
    met: bool
    reason: str
    box: BoxFigure | None = None  # the configuration's cost per frame, when chosen by the box


class NoVariantError(RuntimeError):
    """No profiled variant can be run at all."""


def effective_accuracy(p: Profile) -> float | None:
    """Accuracy from the manifest; without one, fp32 is the reference (1.0), others unknown."""
    if p.accuracy is not None:
        return p.accuracy
    return 1.0 if p.precision == "fp32" else None


def _energy_key(p: Profile) -> float:
    # Rounded so that sub-microjoule noise counts as a tie, which latency then breaks.
    return round(p.energy_mj, 4) if not math.isnan(p.energy_mj) else math.inf


def why_none(profiles: Sequence[Profile], most: int = 3) -> str:
    """What the failed profiles said, most common first, each once with its count (the
    variant's own part, a path before the engine's words, left out): an OTA bundle whose model
    outputs NaN failed on every engine with "output has NaN or Inf values", and the operator
    read only "none of 22 variants could be loaded and run" (outside run, 2026-12-07)."""
    said = collections.Counter(p.error.rsplit(": ", 1)[-1].strip()[:200]
                               for p in profiles if not p.ok and p.error)
    if not said:
        return ""
    parts = [f"{n} x {why!r}" if n > 1 else repr(why) for why, n in said.most_common(most)]
    rest = len(said) - most
    return ": " + "; ".join(parts) + (f"; and {rest} other reasons" if rest > 0 else "")


def select(profiles: Sequence[Profile], c: Constraints) -> Choice:
    """Lowest energy per inference among variants meeting latency and accuracy; ties by latency.

    If none meets the latency target, the fastest accurate-enough variant, and the reason says
    so. If none reaches the accuracy floor, the most accurate one, and the reason says so.
    """
    runnable = at_rate.served([p for p in profiles if p.ok], inference_rate(c))
    if not runnable:
        raise NoVariantError(f"none of {len(profiles)} variants could be loaded and run"
                             + why_none(profiles))
    known = [p for p in runnable if effective_accuracy(p) is not None]
    if not known:
        raise NoVariantError(
            "no runnable variant has a known accuracy (no manifest, and no fp32 variant ran)")
    pct = f"p{c.percentile}"
    floor = c.accuracy_floor
    if floor is None:  # without an operator's floor, never trade more than a little accuracy
        floor = max(effective_accuracy(p) for p in known) - AUTO_TOLERANCE  # type: ignore[type-var]
    eligible = [p for p in known if effective_accuracy(p) >= floor]  # type: ignore[operator]
    if not eligible:
        best = max(known, key=lambda p: (effective_accuracy(p), -p.latency(c.percentile)))
        return Choice(best, False,
                      f"no variant reaches the accuracy floor {floor:.3f}; running the "
                      f"most accurate, {best.variant_id} ({effective_accuracy(best):.3f})")
    if c.by_box:
        return _select_box(eligible, c)
    meeting = [p for p in eligible if p.latency(c.percentile) <= c.latency_ms]
    if not meeting:
        fastest = min(eligible, key=lambda p: (p.latency(c.percentile), _energy_key(p)))
        return Choice(fastest, False,
                      f"no variant meets {pct} <= {c.latency_ms:g} ms; running the fastest, "
                      f"{fastest.variant_id} ({pct} {fastest.latency(c.percentile):.2f} ms)")
    best = min(meeting, key=lambda p: (_energy_key(p), p.latency(c.percentile), p.variant_id))
    best, note = provisional.settle(best, meeting, lambda p: p, lambda p: p.energy_mj)
    return Choice(best, True,
                  f"{best.variant_id}: lowest energy ({best.energy_mj:.3f} mJ/inference, "
                  f"{at_rate.label(best)}) of {len(meeting)} variants meeting {pct} <= "
                  f"{c.latency_ms:g} ms ({pct} {best.latency(c.percentile):.2f} ms){note}")


def inference_rate(c: Constraints) -> float:
    """Inferences per second the constraints' offered rate implies (0: back to back)."""
    rate = c.frame.rate_hz if c.frame is not None and c.frame.rate_hz > 0 else c.rate_hz
    tiles = max(c.frame.tiles, 1) if c.frame is not None else 1
    return rate * tiles if rate > 0 else 0.0


def _select_box(eligible: Sequence[Profile], c: Constraints) -> Choice:
    """`select` by the box (module doc): lowest box energy per frame among the configurations
    meeting the latency target; none meeting it, the fastest."""
    costs = box_costs(c)
    configs = [(p, f) for p in eligible for f in configurations(p, costs, c.percentile)]
    pct = f"p{c.percentile}"
    target, what = box_target(c)
    keeps = [(p, f) for p, f in configs if keeps_up(f, costs)]
    meeting = [(p, f) for p, f in keeps if box_latency(p, f, c) <= target]
    if not meeting:
        p, f = min(keeps or configs,
                   key=lambda x: (box_latency(*x, c), energy_key(x[1]), x[0].variant_id))
        short = "" if keeps else f" (none keeps up with {costs.rate_hz:g} frames/s)"
        return Choice(p, False,
                      f"no configuration meets {pct} {what} <= {target:g} ms{short}; running "
                      f"the fastest, {_name(f)}: {describe(f, costs)}", f)
    p, f = min(meeting, key=lambda x: (energy_key(x[1]), box_latency(*x, c), x[0].variant_id,
                                       x[1].pre_path))
    # a provisional accelerator figure's interval is taken on the whole box figure: wider
    # than its model share's, so it leans to the CPU, as it should until refined
    (p, f), note = provisional.settle((p, f), meeting, lambda x: x[0], lambda x: x[1].box_mj)
    return Choice(p, True,
                  f"{_name(f)}: lowest box energy of {len(meeting)} configurations meeting "
                  f"{pct} {what} <= {target:g} ms: {describe(f, costs)}; model "
                  f"{at_rate.label(p)}{note}", f)


def box_costs(c: Constraints) -> FrameCosts:
    """The frame costs a box choice is figured on (none measured: no idle, a backlog)."""
    return c.frame or FrameCosts(idle_w=0.0, rate_hz=0.0)


def box_target(c: Constraints) -> tuple[float, str]:
    """The latency target a box choice judges against (ms) and what it bounds: end to end
    when `end_to_end_ms` is set, else inference."""
    if c.end_to_end_ms is not None:
        return c.end_to_end_ms, "end to end"
    return c.latency_ms, "inference"


def box_latency(p: Profile, f: BoxFigure, c: Constraints) -> float:
    """The latency of configuration `f` of `p` that `box_target` bounds."""
    return f.e2e_ms if c.end_to_end_ms is not None else p.latency(c.percentile)


def keeps_up(f: BoxFigure, costs: FrameCosts) -> bool:
    """Whether `f` sustains the offered rate: one that cannot queues frames without end and
    meets no latency target, whatever one frame alone takes."""
    return costs.rate_hz <= 0 or f.rate_hz >= costs.rate_hz * (1 - 1e-9)


def meets_box(p: Profile, f: BoxFigure, c: Constraints) -> bool:
    """Whether configuration `f` of `p` meets the box choice's target and keeps up."""
    return keeps_up(f, box_costs(c)) and box_latency(p, f, c) <= box_target(c)[0]


def _name(f: BoxFigure) -> str:
    return f"{f.variant_id} + preprocess {f.pre_path}" if f.pre_path else f.variant_id


def frontier(profiles: Sequence[Profile]) -> list[Profile]:
    """Pareto frontier of (accuracy up, energy down), ordered by energy: the governor's ladder.

    A variant is on it when no other is at least as accurate for less energy.
    """
    known = [p for p in profiles if p.ok and effective_accuracy(p) is not None
             and not math.isnan(p.energy_mj)]
    ordered = sorted(known, key=lambda p: (_energy_key(p), -effective_accuracy(p),  # type: ignore[operator]
                                           p.p95_ms, p.variant_id))
    out: list[Profile] = []
    best = -math.inf
    for p in ordered:
        acc = effective_accuracy(p)
        if acc is not None and acc > best:
            out.append(p)
            best = acc
    return out
