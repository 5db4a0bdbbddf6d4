"""Backoff for a variant switch that keeps failing (a variant that will not load).

The control step asks for its rung every tick (1 s by default). When loading that rung's
session fails (a file corrupted or removed since it was profiled, out of memory) the daemon
stays on what runs; before, it tried again every tick, for ever, with an error line and a
`switch_failed` event each time. Now each model (by its pipeline key, "" = the [model]'s)
retries the same failing variant after 1 s, then 2, 4, ... up to 5 minutes, and says so once
per state change: the first failure (what failed, what runs, when it retries), reaching the
longest interval, and the success that ends it. Asking for another variant, a command or a
config reload (`reset`) tries at once. A step down whose rung will not load falls back to the
next cheaper rung that does (`candidates`): a hot box must get off the hotter rung.

The intervals are the shared schedule (runtime/wire/backoff.py `interval`), without jitter: one
device's own retries have no fleet to fall out of step with. `due`, `failed` and `succeeded` are
pure (tables in tests/device/test_switch_retry.py); `Retries` holds the state per model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from runtime.wire.backoff import interval

FIRST_S = 1.0
CAP_S = 300.0


@dataclass(frozen=True)
class Failing:
    """One model's failing switch: to which variant, how many failures, when to try again."""

    target: str = ""  # the variant that failed to load ("": nothing failing)
    failures: int = 0
    delay_s: float = 0.0  # the interval now in force
    next_at: float = 0.0  # monotonic time of the next attempt
    before: int = 0  # failures before a reset (said when it finally loads)

    @property
    def attempts(self) -> int:
        """Failed attempts in all, across resets."""
        return self.failures + self.before


Say = Literal["", "failing", "capped", "recovered"]


def due(b: Failing, target: str, now: float) -> bool:
    """Try switching to `target` at `now`? Always for another variant than the failing one."""
    return target != b.target or now >= b.next_at


def failed(b: Failing, target: str, now: float, first_s: float = FIRST_S,
           cap_s: float = CAP_S) -> tuple[Failing, Say]:
    """The state after a failed switch to `target`, and what to say: "failing" at the first
    failure of a variant, "capped" when the interval reaches `cap_s`, else nothing."""
    if target != b.target or b.failures == 0:
        delay = interval(1, first_s, cap_s)
        return Failing(target, 1, delay, now + delay,
                       b.before if target == b.target else 0), "failing"
    delay = interval(b.failures + 1, first_s, cap_s)
    say: Say = "capped" if delay >= cap_s > b.delay_s else ""
    return replace(b, failures=b.failures + 1, delay_s=delay, next_at=now + delay), say


def succeeded(b: Failing) -> tuple[Failing, Say]:
    """The state after a switch that worked: nothing failing; "recovered" when something
    had been (before a reset too)."""
    return Failing(), "recovered" if b.attempts else ""


def reset(b: Failing) -> Failing:
    """A command or a config reload: try at once; a failure then starts the intervals
    afresh (and is said again), a success still says what had failed."""
    return Failing(b.target, before=b.attempts) if b.attempts else Failing()


def candidates(wanted: int, running: int) -> list[int]:
    """The rungs to try, in order, when the control step asks for `wanted` while `running`
    runs (rung 0 = the cheapest): a step down (heat, energy) falls back to each cheaper rung
    in turn, since a rung that will not load must not keep a hot box on the hotter one it
    was leaving (every cheaper rung fits the budget too); a step up tries only `wanted`."""
    return list(range(wanted, -1, -1)) if wanted < running else [wanted]


class Retries:
    """The backoff of each model's switch to each variant (main thread only): two variants
    of one model failing in turn (a step down falling back, a budget see-sawing) each keep
    their own interval, rather than restarting each other's at 1 s every tick."""

    def __init__(self, first_s: float = FIRST_S, cap_s: float = CAP_S):
        self.first_s, self.cap_s = first_s, cap_s
        self.state: dict[tuple[str, str], Failing] = {}  # (model key, variant) -> backoff

    def due(self, key: str, target: str, now: float) -> bool:
        """Whether model `key` may try switching to `target` now."""
        return due(self.state.get((key, target), Failing()), target, now)

    def failed(self, key: str, target: str, now: float) -> tuple[Failing, Say]:
        """Record a failed switch of model `key`; the new state and what to say."""
        b, say = failed(self.state.get((key, target), Failing()), target, now, self.first_s,
                        self.cap_s)
        self.state[(key, target)] = b
        return b, say

    def succeeded(self, key: str, target: str | None = None) -> tuple[Failing, Say]:
        """Record a switch of model `key` to `target` that worked (None: any switch of it,
        every variant's backoff ends); the state it ended and what to say."""
        gone = [k for k in self.state if k[0] == key and target in (None, k[1])]
        olds = [self.state.pop(k) for k in gone]
        old = max(olds, key=lambda b: b.attempts, default=Failing())
        return old, succeeded(old)[1]

    def reset(self) -> None:
        """A command or a config reload: every model tries at once."""
        self.state = {k: reset(b) for k, b in self.state.items()}


__all__ = ["CAP_S", "FIRST_S", "Failing", "Retries", "candidates", "due", "failed", "reset",
           "succeeded"]
