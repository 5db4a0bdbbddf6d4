"""Everything that decides an alert's transitions lives in this file (h11's `_state.py`).

The fleet view (fleet.py) says, at each refresh, which alert codes of which device came or
went (`fleet.alert_changes`). What the operator and the webhook are told is decided here, per
(device, code), by one transition table:

    state       on          next        tells
    ---------   ---------   ---------   ----------------------------------------------
    (none)      raised      active      raised (at once)
    (none)      cleared     clearing    - (an alert active before this process started)
    active      raised      active      -
    active      cleared     clearing    - (it must stay away for alert_clear_s)
    clearing    raised      active      - (a flap: back within alert_clear_s, one alert)
    clearing    cleared     clearing    -
    clearing    settled     (none)      cleared (it stayed away alert_clear_s)
    (none)      settled     (none)      -
    active      settled     active      -

so a flapping sensor or link is one alert, not a stream. Pure: time comes in, transitions
go out; the coordinator logs them, records them and hands them to the webhook.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ACTIVE, CLEARING = "active", "clearing"
RAISED, CLEARED, SETTLED = "raised", "cleared", "settled"  # inputs (and what is told)

# (state, input) -> (next state, what is told or None). None as a state: not tracked.
TABLE: dict[tuple[str | None, str], tuple[str | None, str | None]] = {
    (None, RAISED): (ACTIVE, RAISED),
    (None, CLEARED): (CLEARING, None),
    (None, SETTLED): (None, None),
    (ACTIVE, RAISED): (ACTIVE, None),
    (ACTIVE, CLEARED): (CLEARING, None),
    (ACTIVE, SETTLED): (ACTIVE, None),
    (CLEARING, RAISED): (ACTIVE, None),
    (CLEARING, CLEARED): (CLEARING, None),
    (CLEARING, SETTLED): (None, CLEARED),
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
    message: str = ""  # the clear's message (clearing)


class AlertStates:
    """The state of every (device, code) being tracked, driven by TABLE."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}
        self.flaps = 0  # alerts back within alert_clear_s (one alert, not two)

    def apply(self, changes: Iterable[tuple[str, str, str, str]], now: float,
              stamp: float | None = None) -> list[Told]:
        """Feed (device, code, "raised" | "cleared", message) changes; returns what to tell
        now (the raises). `stamp`: the raise's time as told (default `now`); the clock of
        `settle` is `now`'s."""
        out = []
        for device, code, state, message in changes:
            key = (device, code)
            entry = self._entries.get(key) or _Entry(None)
            nxt, told = transition(entry.state, state)
            if entry.state == CLEARING and nxt == ACTIVE:
                self.flaps += 1
            if state == CLEARED and entry.state != CLEARING:
                entry.went, entry.message = now, message
            if told == RAISED:
                entry.raised_t = now if stamp is None else stamp
                out.append(Told(device, code, RAISED, message))
            entry.state = nxt
            self._entries[key] = entry
        return out

    def settle(self, now: float, clear_s: float) -> list[Told]:
        """The clears of alerts that have stayed away `clear_s`; they are told now."""
        out = []
        for key, entry in list(self._entries.items()):
            if entry.state != CLEARING or now - entry.went < clear_s:
                continue
            nxt, told = transition(entry.state, SETTLED)
            if told == CLEARED:
                out.append(Told(*key, CLEARED, entry.message, entry.raised_t))
            if nxt is None:
                del self._entries[key]
            else:
                entry.state = nxt
        return out

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
        """ACTIVE, CLEARING or None (not tracked)."""
        entry = self._entries.get((device, code))
        return entry.state if entry is not None else None
