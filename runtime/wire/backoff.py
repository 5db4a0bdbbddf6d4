"""The one retry schedule: a wait that doubles with each failure in a row, up to a cap.

`interval` is the schedule itself, pure: the MQTT reconnects and the pipeline's source
re-opens (through `Backoff`, which adds jitter), a failing variant switch
(runtime/device/switch_retry.py) and the coordinator's webhook retries all wait what it
says. Tables in tests/wire/test_backoff.py.
"""

from __future__ import annotations

import random

# Past this many doublings the wait is the cap anyway for any cap/first ratio a float holds;
# the bound keeps 2 ** n a float (2 ** 1024 does not convert) however long a failure lasts.
_MAX_DOUBLINGS = 1023


def interval(failures: int, first_s: float, cap_s: float) -> float:
    """The wait after `failures` failures in a row (1 = the first): `first_s`, doubled for
    each failure after the first, never over `cap_s`."""
    return min(cap_s, first_s * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS))


class Backoff:
    """Capped exponential backoff with full jitter, so a fleet does not reconnect in step:
    each delay is drawn from the upper half of `interval`'s wait for the failures so far."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None):
        self.base_s, self.cap_s = base_s, cap_s
        self.attempts = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Delay before the next attempt; grows until `reset`."""
        self.attempts += 1
        ceiling = interval(self.attempts, self.base_s, self.cap_s)
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """A connection succeeded."""
        self.attempts = 0


__all__ = ["Backoff", "interval"]
