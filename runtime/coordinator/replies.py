"""The command replies a coordinator awaits without a thread waiting for each.

A command sent for a rollout or a returning device is remembered here, by its id, until its
reply comes or its wait is over (`expire`, from the refresh tick). At most `max_size` are
held: past that the oldest is forgotten and counted (`dropped`), so a flood of births costs
memory up to the bound, never a thread. Thread-safe (ingest thread, HTTP threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Awaited:
    """One command whose reply is awaited: to whom, what, with which arguments, until when."""

    device: str
    name: str
    args: dict[str, Any]
    until: float


class PendingReplies:
    """A bounded table of Awaited by command id (see module docstring)."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._items: OrderedDict[str, Awaited] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0  # forgotten at the bound
        self.expired = 0  # never answered within their wait

    def add(self, command_id: str, awaited: Awaited) -> None:
        """Await the reply to `command_id` (the oldest is forgotten past max_size)."""
        with self._lock:
            self._items[command_id] = awaited
            while len(self._items) > self.max_size:
                self._items.popitem(last=False)
                self.dropped += 1

    def get(self, command_id: str) -> Awaited | None:
        """The awaited command of that id, if any (left in place)."""
        with self._lock:
            return self._items.get(command_id)

    def pop(self, command_id: str) -> Awaited | None:
        """Take the awaited command of that id (its reply came)."""
        with self._lock:
            return self._items.pop(command_id, None)

    def expire(self, now: float) -> int:
        """Forget the commands whose wait is over; how many."""
        with self._lock:
            late = [i for i, a in self._items.items() if a.until <= now]
            for i in late:
                del self._items[i]
            self.expired += len(late)
        return len(late)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
