"""How many of a device's refused messages get a detail row in the store's `quarantine`.

Every refusal is counted (`quarantine_counts`, exact, for ever), but a detail row each made one
device's flood cost the ingest that every device shares: 10,000 refused items of one message
were 10,000 inserts (trimmed to QUARANTINE_PER_DEVICE after). A device may add a burst of
detail rows, then `per_s` a second (a token bucket per device, on the times the rows carry);
past that, what is refused in one call is one summary row (`N more refused, not kept in
detail`, the first one's reason, their bytes). Pure: the caller passes the times.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

# a device's detail rows: this many at once, then this many a second
DETAIL_BURST = 100
DETAIL_PER_S = 1.0
# devices whose bucket is remembered; past it the full ones (refilled) are forgotten, and if
# that is not enough all are (each then starts with a burst: bounded all the same)
DETAIL_DEVICES = 10_000

Row = tuple[str, str, str, int, float]  # (device, topic, reason, size, t)


class DetailBudget:
    """A token bucket of detail rows per device (see module docstring)."""

    def __init__(self, burst: int = DETAIL_BURST, per_s: float = DETAIL_PER_S,
                 devices: int = DETAIL_DEVICES):
        self.burst, self.per_s, self.devices = burst, per_s, devices
        self._left: dict[str, tuple[float, float]] = {}  # device -> (tokens, at)
        self._lock = threading.Lock()  # the ingest thread's and the start's checks

    def take(self, device: str, n: int, now: float) -> int:
        """How many of `n` refusals of `device` at `now` get a detail row (taken from its
        bucket). A clock stepped back refills nothing; stepped forward, at most a burst."""
        with self._lock:
            tokens, at = self._left.get(device, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - at) * self.per_s)
            k = min(n, int(tokens))
            self._left[device] = (tokens - k, now)
            if len(self._left) > self.devices:
                self._forget(now)
            return k

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (the same as none), else all."""
        full = [d for d, (tk, at) in self._left.items()
                if tk + max(0.0, now - at) * self.per_s >= self.burst]
        for d in full:
            del self._left[d]
        if len(self._left) > self.devices:
            self._left.clear()

    def sample(self, rows: Sequence[Row]) -> tuple[list[Row], int]:
        """The detail rows to insert for `rows` (one call's refusals, in order): each
        device's first ones its bucket allows, then one summary row for its others; and how
        many refusals got no row of their own."""
        per: dict[str, list[Row]] = {}
        for r in rows:
            per.setdefault(r[0], []).append(r)
        out: list[Row] = []
        left_out = 0
        for device, mine in per.items():
            k = self.take(device, len(mine), max(r[4] for r in mine))
            out += mine[:k]
            if rest := mine[k:]:
                left_out += len(rest)
                first = rest[0]
                out.append((device, first[1],
                            f"{len(rest)} more refused, not kept in detail (past "
                            f"{self.burst} rows, then {self.per_s:g} a second, a device; all "
                            f"counted); the first: {first[2]}",
                            sum(r[3] for r in rest), rest[-1][4]))
        return out, left_out
