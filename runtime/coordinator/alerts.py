"""Everything that decides an alert's transitions lives in this file (h11's `_state.py`).

The fleet view (fleet.py) says, at each refresh, which alert codes of which device came or
went (`fleet.alert_changes`). What the operator and the webhook are told is decided here, per
(device, code), by one transition table:

    state       on          next        tells
    ---------   ---------   ---------   ----------------------------------------------
    (none)      raised      active      raised (at once)
    (none)      held        raising     - (a code with a raise delay: told once it lasts;
                                          `raised` instead after an `after` code told)
    (none)      cleared     clearing    - (an alert active before this process started)
    raising     due         active      raised (it lasted its raise delay)
    raising     cleared     paused      - (gone before its delay: kept alert_clear_s)
    raising     raised      raising     -
    raising     held        raising     -
    paused      held        raising     - (a flap: back within alert_clear_s, its delay
                                          counted from when it first came)
    paused      raised      active      raised (after an `after` code told)
    paused      cleared     paused      -
    paused      settled     (none)      - (it stayed away: never told, counted)
    active      raised      active      -
    active      held        active      -
    active      cleared     clearing    - (it must stay away for alert_clear_s)
    clearing    raised      active      - (a flap: back within alert_clear_s, one alert)
    clearing    held        active      - (the same flap)
    clearing    cleared     clearing    -
    clearing    settled     (none)      cleared (it stayed away alert_clear_s)
    (any other) settled/due (same)      -

so a flapping sensor or link is one alert, not a stream (nor none: a link offline 50 s of
every minute lasts its delay across the flaps), and an `offline` that lasts seconds
(a broker's restart publishes every connected device's will: mosquitto 2, measured
2026-12-07; a service restart says offline) is none. Pure: time comes in, transitions go
out; the coordinator logs them, records them and hands them to the webhook. Its `now` is
elapsed time (the coordinator's steady clock, runtime/wire/clock.py StepClock: a step of the
wall clock neither fires a delay early nor freezes it); the times told (`stamp`) are wall.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RAISING, PAUSED, ACTIVE, CLEARING = "raising", "paused", "active", "clearing"
RAISED, CLEARED, SETTLED = "raised", "cleared", "settled"  # inputs (and what is told)
HELD, DUE = "held", "due"  # inputs: raised with a delay; the delay passed

# (state, input) -> (next state, what is told or None). None as a state: not tracked.
TABLE: dict[tuple[str | None, str], tuple[str | None, str | None]] = {
    (None, RAISED): (ACTIVE, RAISED),
    (None, HELD): (RAISING, None),
    (None, CLEARED): (CLEARING, None),
    (None, SETTLED): (None, None),
    (None, DUE): (None, None),
    (RAISING, RAISED): (RAISING, None),
    (RAISING, HELD): (RAISING, None),
    (RAISING, CLEARED): (PAUSED, None),
    (RAISING, SETTLED): (RAISING, None),
    (RAISING, DUE): (ACTIVE, RAISED),
    (PAUSED, RAISED): (ACTIVE, RAISED),
    (PAUSED, HELD): (RAISING, None),
    (PAUSED, CLEARED): (PAUSED, None),
    (PAUSED, SETTLED): (None, None),
    (PAUSED, DUE): (PAUSED, None),
    (ACTIVE, RAISED): (ACTIVE, None),
    (ACTIVE, HELD): (ACTIVE, None),
    (ACTIVE, CLEARED): (CLEARING, None),
    (ACTIVE, SETTLED): (ACTIVE, None),
    (ACTIVE, DUE): (ACTIVE, None),
    (CLEARING, RAISED): (ACTIVE, None),
    (CLEARING, HELD): (ACTIVE, None),
    (CLEARING, CLEARED): (CLEARING, None),
    (CLEARING, SETTLED): (None, CLEARED),
    (CLEARING, DUE): (CLEARING, None),
}


def transition(state: str | None, event: str) -> tuple[str | None, str | None]:
    """The table's row for (state, event); KeyError for an input it does not know."""
    return TABLE[(state, event)]


@dataclass(frozen=True)
class Told:
    """One transition to tell: `state` raised or cleared, with the alert's message and, for
    a clear, when it was raised (None: before this process started)."""

    device: str
    code: str
    state: str
    message: str
    raised_t: float | None = None


@dataclass
class _Entry:
    state: str | None
    raised_t: float | None = None  # when it was told raised (this process)
    went: float = 0.0  # when it went (clearing)
    message: str = ""  # the clear's message (clearing); the raise's (raising)
    came: float = 0.0  # when it came (raising)


class AlertStates:
    """The state of every (device, code) being tracked, driven by TABLE."""

    def __init__(self, raise_s: Mapping[str, float] | None = None,
                 after: Mapping[str, Iterable[str]] | None = None) -> None:
        """`raise_s`: the codes told raised only once they have lasted this long; `after`:
        for such a code, the codes whose alert, told and not cleared yet on the same device,
        make its raise told at once (`offline` after `stale`: the silence has lasted and
        was told already; held back, the stale's clear left nothing open meanwhile)."""
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._raise_s = {c: s for c, s in (raise_s or {}).items() if s > 0}
        self._after = {c: tuple(codes) for c, codes in (after or {}).items()}
        self.flaps = 0  # alerts back within alert_clear_s (one alert, not two)
        self.held_back = 0  # alerts gone before their raise delay, away alert_clear_s (untold)

    def apply(self, changes: Iterable[tuple[str, str, str, str]], now: float,
              stamp: float | None = None) -> list[Told]:
        """Feed (device, code, "raised" | "cleared", message) changes; returns what to tell
        now (the raises). `stamp`: the raise's time as told (default `now`); the clock of
        `settle` is `now`'s."""
        out = []
        for device, code, state, message in changes:
            key = (device, code)
            entry = self._entries.get(key) or _Entry(None)
            if state == RAISED and code in self._raise_s and not self._follows(device, code):
                state = HELD
            nxt, told = transition(entry.state, state)
            if (entry.state, nxt) in ((CLEARING, ACTIVE), (PAUSED, RAISING)):
                self.flaps += 1
            if state == CLEARED and entry.state not in (CLEARING, PAUSED):
                entry.went, entry.message = now, message
            if nxt == RAISING and entry.state != RAISING:
                if entry.state != PAUSED:  # back from paused: its delay from the first came
                    entry.came = now
                entry.message = message
            if told == RAISED:
                entry.raised_t = now if stamp is None else stamp
                out.append(Told(device, code, RAISED, message))
            self._put(key, entry, nxt)
        return out

    def settle(self, now: float, clear_s: float, stamp: float | None = None) -> list[Told]:
        """The clears of alerts that have stayed away `clear_s` and the raises of those that
        have lasted their raise delay; they are told now (`stamp`: a raise's time as told,
        default `now`)."""
        out = []
        for key, entry in list(self._entries.items()):
            if entry.state in (CLEARING, PAUSED) and now - entry.went >= clear_s:
                nxt, told = transition(entry.state, SETTLED)
                if entry.state == PAUSED:
                    self.held_back += 1
            elif entry.state == RAISING and now - entry.came >= self._raise_s[key[1]]:
                nxt, told = transition(entry.state, DUE)
            else:
                continue
            if told == CLEARED:
                out.append(Told(*key, CLEARED, entry.message, entry.raised_t))
            elif told == RAISED:
                entry.raised_t = round(now if stamp is None else stamp, 3)  # as apply's is
                out.append(Told(*key, RAISED, entry.message))
            self._put(key, entry, nxt)
        return out

    def hold(self, device: str, code: str, now: float, message: str) -> bool:
        """Track an alert already active at start that the run before never told (it was
        still within its raise delay when that run ended) as raising from `now`: told once
        it lasts its delay from here, never if it goes first. False (nothing done) for a code
        without a delay or one already tracked."""
        key = (device, code)
        if code not in self._raise_s or key in self._entries:
            return False
        self._entries[key] = _Entry(RAISING, message=message, came=now)
        return True

    def _follows(self, device: str, code: str) -> bool:
        """Whether an alert of one of `code`'s `after` codes is told and not cleared on
        `device` (active or clearing)."""
        for c in self._after.get(code, ()):
            e = self._entries.get((device, c))
            if e is not None and e.state in (ACTIVE, CLEARING):
                return True
        return False

    def delayed(self, code: str) -> bool:
        """Whether `code` is told raised only once it has lasted its raise delay."""
        return code in self._raise_s

    def raising_since(self, device: str, code: str) -> float | None:
        """When a raising alert (not told yet: within its raise delay) came; None otherwise."""
        entry = self._entries.get((device, code))
        return entry.came if entry is not None and entry.state == RAISING else None

    def _put(self, key: tuple[str, str], entry: _Entry, state: str | None) -> None:
        if state is None:
            self._entries.pop(key, None)
        else:
            entry.state = state
            self._entries[key] = entry

    def raised_at(self, device: str, code: str) -> float | None:
        """When this process told (device, code) raised, while it is active or clearing."""
        entry = self._entries.get((device, code))
        return entry.raised_t if entry is not None else None

    def clearing(self) -> list[tuple[str, str, float, str]]:
        """(device, code, when it went, its message) of every alert gone but not settled yet
        (the dashboard shows them as "clearing" until `settle` tells the clear)."""
        return sorted((*key, e.went, e.message) for key, e in self._entries.items()
                      if e.state == CLEARING)

    def state(self, device: str, code: str) -> str | None:
        """RAISING, PAUSED, ACTIVE, CLEARING or None (not tracked)."""
        entry = self._entries.get((device, code))
        return entry.state if entry is not None else None
