"""How long a device of a rollout has been silent about its verdict, not counting its sleeps.

A device sent a model has `coordinator.rollout_timeout_s` to report a verdict (probation
passed, rolled back, deploy failed); one that never answers counts as failed so that a silent
canary halts its rollout instead of holding it for ever. A solar node that announced a sleep
(docs/sleep.md: its state says `asleep` until `wake_at`) is not silent: it runs no frames and
so cannot finish a probation while it sleeps. Its clock counts only the time it was awake or
expected awake: each sleep the coordinator saw is noted on the device's part of the rollout as
`[since, wake_at]`, and that time is taken off. A sleeper still asleep `wake_margin_s` past its
announced wake (the fleet view's `missed_wake`) fails at once: it may never come back.

Pure functions (tested with tables in tests/coordinator/test_rollout_sleep.py); rollout.py
calls them.
"""

from __future__ import annotations

import time

from runtime.coordinator.fleet import LONGEST_SLEEP_S

MAX_SLEEPS = 64  # sleeps noted per device and rollout (a rollout lasting weeks of nights)
# The longest sleep believed, the fleet view's (a device's [sleep] max_sleep_s may not exceed
# it). A wake announced further ahead — a device clock running days fast, a hostile `wake_at`
# up to the year 2286 — counts this much sleep and no more: it must not hold a canary stage
# for ever.
MAX_SLEEP_S = LONGEST_SLEEP_S


def believed_wake(since: float, wake_at: float) -> float:
    """The wake a sleep from `since` is credited up to: `wake_at`, at most MAX_SLEEP_S on."""
    return min(wake_at, since + MAX_SLEEP_S)


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
            asleep_until: float | None, wake_margin_s: float,
            asleep_since: float | None = None) -> str | None:
    """Why a device sent a model at `sent` and without a verdict at `now` counts as failed,
    or None while it still has time. `asleep_until` is its announced wake when the fleet
    view says it sleeps now (None when awake), `asleep_since` when that sleep began (when
    given, a wake more than MAX_SLEEP_S after it is believed only that far).

    A device already out of time when it fell asleep (between two ticks, or while every
    coordinator was down) is not failed before its wake: `asleep_since` may be the device's
    own clock (a coordinator that has not heard it since its start), which must not fail it.
    Its awake time before the sleep still counts, so it fails at its wake."""
    if asleep_until is not None and asleep_since is not None:
        wake = believed_wake(asleep_since, asleep_until)
        if wake < asleep_until and now > wake + wake_margin_s:
            return (f"announced a sleep until {_clock(asleep_until, True)}, more than "
                    f"{MAX_SLEEP_S / 3600:.0f} h after it was last heard awake: not believed "
                    f"past {_clock(wake, True)}, and not heard from since (no verdict)")
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


def _clock(t: float, date: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S UTC",
                         time.gmtime(min(max(t, 0.0), 1e11)))
