"""`[constraints]`: what the operator asks of inference, as the one `Constraints` type the
config reads, the selector judges by (runtime/choice/selector.py), the operator's commands
change (`set_latency_target`, `set_accuracy_floor`: runtime/wire/commands.py) and the saved
overrides restore (runtime/device/operator_state.py), with the one validity rule for each
of its numbers (`latency_target_problem`, `accuracy_floor_problem`) that all of them apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from runtime.config.schema import NOT_A_KEY

# The longest latency target (ms) any reader accepts: a minute per inference or per frame is
# no real-time target, and a larger number is a unit slip (seconds typed as ms ...).
LATENCY_TARGET_MAX_MS = 60_000.0


def latency_target_problem(ms: Any) -> str | None:
    """Why `ms` cannot be a latency target in milliseconds (`latency_ms`, `end_to_end_ms`,
    the command's `ms`, the saved override); None when it can: a finite number > 0 and at
    most LATENCY_TARGET_MAX_MS. (A tiny target is allowed: it is the way to ask for the
    fastest variant whatever it costs.) The caller names the key."""
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) \
            or not 0 < ms <= LATENCY_TARGET_MAX_MS:
        return (f"must be > 0: expected a number of milliseconds, at most "
                f"{LATENCY_TARGET_MAX_MS:g}, got {ms!r}")
    return None


def accuracy_floor_problem(value: Any) -> str | None:
    """Why `value` cannot be an accuracy floor (a fraction, 0..1); None when it can."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        return f"must be within 0..1: expected a number, got {value!r}"
    return None


# constraints field -> its rule: what the operator's commands and overrides may set
RULES = {"latency_ms": latency_target_problem, "accuracy_floor": accuracy_floor_problem}


@dataclass(frozen=True)
class Constraints:
    """What the operator asks of inference. `latency_ms` is inference latency (one
    inference, at the percentile): what it has always meant. `end_to_end_ms`, when set, is the
    target instead: frame in to durable result (decode to the outbox commit) at the
    percentile, per frame; the selector then ranks whole configurations by the box's energy
    per frame against it, and inference latency is only reported (runtime/choice/selector.py).

    `frame` and `rate_hz` are what the device measures and plans, set where it hands these
    constraints to the selector; they are no keys of `[constraints]`."""

    latency_ms: float = 20.0
    percentile: Literal[50, 95, 99] = 95
    accuracy_floor: float | None = None  # unset: the best variant's accuracy minus 0.02
    end_to_end_ms: float | None = None  # unset: the target is latency_ms, inference alone
    # the stages around inference (runtime.choice.frame_cost.FrameCosts, which this leaf cannot
    # import); None: the model alone
    frame: Any = field(default=None, metadata=NOT_A_KEY)
    # frames offered per second (0: not known, or a backlog): accelerators are ranked by
    # their energy at this rate (runtime/choice/at_rate.py); `frame.rate_hz` when frame is set
    rate_hz: float = field(default=0.0, metadata=NOT_A_KEY)

    @property
    def by_box(self) -> bool:
        """Whether the choice is by the box's energy per frame (runtime/choice/selector.py)."""
        return self.frame is not None or self.end_to_end_ms is not None

    def in_force(self) -> tuple[float, bool]:
        """The latency target in force (ms), and whether it is end to end: what the choice
        is judged on, the SLO compliance counts and `set_latency_target` changes."""
        if self.end_to_end_ms is not None:
            return self.end_to_end_ms, True
        return self.latency_ms, False

    def with_target(self, ms: float) -> Constraints:
        """These constraints with the latency target in force set to `ms` (`in_force`):
        what `set_latency_target` means, applied and restored after a restart."""
        return replace(self, **{"end_to_end_ms" if self.in_force()[1] else "latency_ms": ms})

    def validate(self) -> tuple[str, str] | None:
        """The first invalid key and why (None: valid)."""
        for key in ("latency_ms", "end_to_end_ms"):
            value = getattr(self, key)
            if value is not None and (problem := latency_target_problem(value)):
                return key, problem
        if self.accuracy_floor is not None and \
                (problem := accuracy_floor_problem(self.accuracy_floor)):
            return "accuracy_floor", problem
        return None
