"""How long a device of a rollout has been silent about its verdict, not counting its sleeps.

A device sent a model has `coordinator.rollout_timeout_s` to report a verdict (probation
passed, rolled back, deploy failed); one that never answers counts as failed so that a silent
canary halts its rollout instead of holding it for ever. A solar node that announced a sleep
(docs/sleep.md: its state says `asleep` until `wake_at`) is not silent: it runs no frames and
so cannot finish a probation while it sleeps. Its clock counts only the time it was awake or
expected awake: each sleep the coordinator saw is noted on the device's part of the rollout as
`[since, wake_at]`, and that time is taken off. A sleeper still asleep `wake_margin_s` past its
announced wake (the fleet view's `missed_wake`) fails at once: it may never come back.

Pure functions (tested with tables in tests/test_rollout_sleep.py); rollout.py calls them.
"""

from __future__ import annotations

import time

MAX_SLEEPS = 64  # sleeps noted per device and rollout (a rollout lasting weeks of nights)


def note_sleep(sleeps: list[list[float]], since: float, wake_at: float, now: float) -> bool:
    """Add the sleep from `since` to `wake_at` to `sleeps` (in place) unless it is noted
    already (the same announced wake); returns whether it was added. `since` (the device's
    clock when it announced the sleep) is clamped to `now`, so a clock running ahead cannot
    hide time that has not passed yet."""
    if wake_at <= 0 or any(abs(w - wake_at) < 1e-6 for _, w in sleeps):
        return False
    sleeps.append([min(since, now), wake_at])
    del sleeps[:-MAX_SLEEPS]
    return True


def asleep_s(sent: float, now: float, sleeps: list[list[float]]) -> float:
    """Seconds of [sent, now] covered by the noted sleeps (overlapping ones counted once)."""
    spans = sorted((max(a, sent), min(b, now)) for a, b in sleeps)
    total, end = 0.0, sent
    for a, b in spans:
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


def overdue(sent: float, now: float, timeout_s: float, sleeps: list[list[float]],
            asleep_until: float | None, wake_margin_s: float) -> str | None:
    """Why a device sent a model at `sent` and without a verdict at `now` counts as failed,
    or None while it still has time. `asleep_until` is its announced wake when the fleet
    view says it sleeps now (None when awake)."""
    if asleep_until is not None and now > asleep_until + wake_margin_s:
        return (f"missed its wake: announced for {_clock(asleep_until)} and not heard from "
                f"{wake_margin_s:.0f} s after it (no verdict)")
    if asleep_until is not None:
        return None  # asleep on purpose: its clock does not run
    slept = asleep_s(sent, now, sleeps)
    if now - sent - slept <= timeout_s:
        return None
    return (f"no verdict within {timeout_s:.0f} s of the deploy"
            + (f" (awake; {slept:.0f} s asleep not counted)" if slept > 0 else ""))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))
