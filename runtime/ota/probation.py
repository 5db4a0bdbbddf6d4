"""Probation of a newly swapped-in model: a pure comparison of its live KPIs with the old one's.

After a swap the daemon counts, on live traffic, the new model's frames, inference errors, p95
latency and energy per inference, and runs every Nth frame through the old model as well (the
shadow sample) to count top-1 agreement. `judge` turns those numbers into a verdict; the daemon
rolls back on `failed` and reports the reasons. A model that is slower than the old one but
still within the latency target passes; one that misses the target fails unless the old one
missed it by as much.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

MIN_SHADOW = 20  # shadow comparisons before agreement is judged (1 of 20 = 5% resolution)
# A verdict waits for the new model's live energy (made from 50 inferences,
# runtime/device/live_energy.py LIVE_MIN_INFERENCES) until this many frames, or twice
# min_frames when that is more
ENERGY_WAIT_FRAMES = 200
# ... and for the like-with-like shadow sample (the new model on the old session's form,
# runtime/frames/shadow.py) this many times its frames (or the probation's, if more), before
# the sample of every form is judged instead: a governor that holds the new model on another
# rung would otherwise keep a probation open for ever
SHADOW_WAIT_FACTOR = 5


def shadow_wait_frames(probation_frames: int, shadow_every: int) -> int:
    """Frames the like-with-like shadow sample is waited for."""
    return SHADOW_WAIT_FACTOR * max(probation_frames, MIN_SHADOW * shadow_every)


def cannot_reach(compared: int, agreed: int, floor: float, min_shadow: int = MIN_SHADOW
                 ) -> bool:
    """A shadow sample short of `min_shadow` that would miss `floor` there even if every
    comparison still to come agreed: judged now (a bad model serves no longer than that)."""
    return 0 < compared < min_shadow and agreed + (min_shadow - compared) < floor * min_shadow


def shadow_failed(compared: int, failed: int, min_shadow: int = MIN_SHADOW) -> bool:
    """The old model's session failed `min_shadow` shadow inferences before as many
    comparisons were made: the old model cannot be compared with (its fault, not the new
    one's), so the probation goes on without agreement, as when no old session loads,
    instead of waiting for a sample that may never fill."""
    return compared < min_shadow and failed >= min_shadow


def shadow_figures(like: tuple[int, int], mixed: tuple[int, int], frames: int,
                   wait_frames: int, floor: float, min_shadow: int = MIN_SHADOW
                   ) -> tuple[tuple[int, int], bool]:
    """The shadow sample judged, as (compared, agreed), and whether it is the like-with-like
    one: that one once it holds `min_shadow` comparisons, once it cannot reach `floor`, or
    while fewer than `wait_frames` frames ran; after that, the sample of every form (a
    difference between two forms then counts against the new model, as it did before forms
    were matched: never a weaker test)."""
    if like[0] >= min_shadow or frames < wait_frames or cannot_reach(*like, floor, min_shadow):
        return like, True
    return mixed, False


def judged_shadow(like: tuple[int, int], mixed: tuple[int, int], frames: int,
                  wait_frames: int, floor: float, gave_up: bool = False,
                  min_shadow: int = MIN_SHADOW) -> tuple[tuple[int, int], bool]:
    """`shadow_figures`; with the old session given up (`shadow_failed`), no agreement,
    (0, 0), unless what was compared before already cannot reach `floor` (then that is
    judged: a version failing its sample is not passed because the old session broke)."""
    figures, is_like = shadow_figures(like, mixed, frames, wait_frames, floor, min_shadow)
    if gave_up and not cannot_reach(*figures, floor, min_shadow):
        return (0, 0), True
    return figures, is_like


@dataclass(frozen=True)
class Kpis:
    """One model's numbers over a window of live traffic."""

    frames: int = 0  # frames attempted (results + inference errors)
    errors: int = 0  # inference errors
    p95_ms: float | None = None  # inference latency
    energy_mj: float | None = None  # per inference

    @property
    def error_rate(self) -> float:
        """Errors per frame attempted (0 without frames)."""
        return self.errors / self.frames if self.frames else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (kept in the model pointer as the baseline)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Kpis | None:
        """The inverse of to_dict; None for an empty or unusable baseline."""
        if not d:
            return None
        try:
            return cls(int(d.get("frames", 0)), int(d.get("errors", 0)),
                       None if d.get("p95_ms") is None else float(d["p95_ms"]),
                       None if d.get("energy_mj") is None else float(d["energy_mj"]))
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Limits:
    """What a new model must show (from `[models]` and `[constraints]`)."""

    latency_ms: float  # the constraint's target, compared with the new p95
    min_frames: int = 200
    agreement_floor: float = 0.8
    max_error_rate_increase: float = 0.01
    energy_factor: float = 1.5
    min_shadow: int = MIN_SHADOW


@dataclass(frozen=True)
class Verdict:
    """`pending` until enough traffic was seen; then `passed` or `failed` with reasons."""

    state: Literal["pending", "passed", "failed"]
    reasons: tuple[str, ...] = ()
    agreement: float | None = None


def judge(old: Kpis | None, new: Kpis, compared: int, agreed: int, lim: Limits) -> Verdict:
    """Compare the new model's live KPIs (and its shadow agreement with the old model:
    `agreed` of `compared` frames) with the old model's. `old` None: no baseline (a device
    that restarted into probation after an offline install): absolute limits only."""
    agreement = agreed / compared if compared else None
    reasons = []
    old_rate = old.error_rate if old is not None else 0.0
    if new.frames and new.error_rate > old_rate + lim.max_error_rate_increase:
        reasons.append(f"error rate {new.error_rate:.1%} vs {old_rate:.1%} before "
                       f"(at most +{lim.max_error_rate_increase:.1%})")
    if new.frames < lim.min_frames:
        # Errors this high already cannot recover within the window: fail early.
        if reasons and new.errors > lim.min_frames * (old_rate + lim.max_error_rate_increase):
            return Verdict("failed", tuple(reasons), agreement)
        return Verdict("pending", (), agreement)
    if old is not None and old.energy_mj and new.energy_mj is None \
            and new.frames < max(ENERGY_WAIT_FRAMES, 2 * lim.min_frames):
        # The new model's live energy is made from its first 50 inferences: a probation
        # judged before (probation_frames < 50) was passed without the energy rule.
        # Wait for it (a bounded while: a variant that never gets a figure is judged
        # without it rather than held in probation for ever).
        return Verdict("pending", (), agreement)
    if new.p95_ms is not None and new.p95_ms > lim.latency_ms:
        old_missed = old is not None and old.p95_ms is not None and old.p95_ms > lim.latency_ms
        if not (old_missed and new.p95_ms <= old.p95_ms):
            reasons.append(f"p95 {new.p95_ms:.2f} ms misses the {lim.latency_ms:g} ms target"
                           + (f" (old model: {old.p95_ms:.2f} ms)" if old is not None
                              and old.p95_ms is not None else ""))
    if old is not None and old.energy_mj and new.energy_mj is not None \
            and new.energy_mj > lim.energy_factor * old.energy_mj:
        reasons.append(f"energy {new.energy_mj:.3f} mJ per inference vs {old.energy_mj:.3f} mJ "
                       f"before (at most {lim.energy_factor:g}x)")
    if compared >= lim.min_shadow and agreement is not None \
            and agreement < lim.agreement_floor:
        reasons.append(f"agrees with the old model on {agreement:.1%} of {compared} shadow "
                       f"frames (floor {lim.agreement_floor:.0%})")
    elif cannot_reach(compared, agreed, lim.agreement_floor, lim.min_shadow):
        reasons.append(f"agrees with the old model on {agreed} of the first {compared} shadow "
                       f"frames: under the {lim.agreement_floor:.0%} floor at "
                       f"{lim.min_shadow} whatever follows")
    if reasons:
        return Verdict("failed", tuple(reasons), agreement)
    if compared < lim.min_shadow and old is not None:
        return Verdict("pending", (), agreement)  # traffic enough, shadow sample not yet
    return Verdict("passed", (), agreement)


__all__ = ["Kpis", "Limits", "Verdict", "cannot_reach", "judge", "judged_shadow",
           "shadow_failed", "shadow_figures", "shadow_wait_frames"]
