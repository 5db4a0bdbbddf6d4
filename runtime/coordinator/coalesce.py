"""Latest-wins coalescing per key: bounded work per device, however fast it sends.

A key (a device) may act once per window: the first offer acts at once, the offers that
follow within the window replace one another (the latest wins) and the last of them acts
when the window ends (`due`). So a burst of N messages costs two actions, not N, and the
last word is never lost. Offers equal to the one that acted last (`same`) are dropped: a
birth of the boot that was already answered costs nothing.

Bounded: at most `max_keys` keys are remembered (the least recently offered are forgotten
first, counted in `forgotten`), so a flood of forged keys costs memory up to the bound only.
Pure: time is passed in; the coordinator's ingest thread is its only caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Key:
    acted_at: float
    acted: Any  # what acted last (compared by `same`)
    pending: Any = None
    has_pending: bool = False


@dataclass
class Coalescer:
    """One window per key (see module docstring)."""

    window_s: float
    max_keys: int = 100_000
    keys: OrderedDict = field(default_factory=OrderedDict)
    waiting: dict = field(default_factory=dict)  # the keys holding an offer (ordered)
    acted: int = 0  # offers that acted (at once or when due)
    coalesced: int = 0  # offers replaced by a later one, or equal to the last action
    forgotten: int = 0  # keys dropped at the bound

    def offer(self, key: Any, value: Any, now: float, same: Any = None) -> bool:
        """True when `value` acts now (the caller acts on it); False when it is held (the
        latest held acts at the window's end, from `due`) or dropped (`same` equals the
        `same` of what acted last for this key)."""
        k = self.keys.get(key)
        if k is not None:
            self.keys.move_to_end(key)
            if same is not None and same == k.acted and not k.has_pending:
                self.coalesced += 1
                return False
            if now - k.acted_at < self.window_s:
                if k.has_pending:
                    self.coalesced += 1  # the one it replaces never acts
                k.pending, k.has_pending = (value, same), True
                self.waiting[key] = None
                return False
            if k.has_pending:  # its window ended and `due` has not run yet: this one is
                self.coalesced += 1  # newer, acts now, and the held one never does
            k.acted_at, k.acted, k.pending, k.has_pending = now, same, None, False
            self.waiting.pop(key, None)
            self.acted += 1
            return True
        self.keys[key] = _Key(now, same)
        while len(self.keys) > self.max_keys:
            old, _ = self.keys.popitem(last=False)
            self.waiting.pop(old, None)
            self.forgotten += 1
        self.acted += 1
        return True

    def due(self, now: float) -> list[tuple[Any, Any]]:
        """(key, value) of every held offer whose window has ended; they act now."""
        out = []
        for key in list(self.waiting):
            k = self.keys[key]
            if now - k.acted_at >= self.window_s:
                value, same = k.pending
                k.acted_at, k.acted, k.pending, k.has_pending = now, same, None, False
                del self.waiting[key]
                out.append((key, value))
        self.acted += len(out)
        return out

    def flush(self, which: Callable[[Any], bool]) -> list[tuple[Any, Any]]:
        """(key, value) of every held offer whose key `which` selects, now (their windows
        cut short: what the device said before a change of its state must not act after
        it)."""
        out = []
        for key in [k for k in self.waiting if which(k)]:
            k = self.keys[key]
            value, same = k.pending
            k.acted, k.pending, k.has_pending = same, None, False
            del self.waiting[key]
            out.append((key, value))
        self.acted += len(out)
        return out

    def held(self) -> int:
        """How many keys hold an offer waiting for its window's end."""
        return len(self.waiting)

    def stats(self) -> dict[str, int]:
        """Counters for the coordinator's stats and /metrics."""
        return {"keys": len(self.keys), "max_keys": self.max_keys, "held": self.held(),
                "acted": self.acted, "coalesced": self.coalesced,
                "forgotten": self.forgotten}
