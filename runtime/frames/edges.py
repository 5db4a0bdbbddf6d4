"""PLC edges waiting for their capture: one bounded FIFO per PLC-triggered source.

The OPC UA server (runtime/telemetry/opcua_server.py) pushes an edge for each Trigger() call
and each PartPresent false->true; the source's capture thread (sources.EdgeTriggered) takes
them in order, one frame each. An edge is never dropped once accepted: a full queue refuses
the push (the PLC is told, the refusal counted), and an edge whose capture failed is put back
at the front for the next try. Thread-safe; no I/O.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Edge:
    """One rising edge of the PLC: its number on its source (1, 2, ...; the frame is
    `plc-<n>`), when it arrived (wall time: the frame's time) and what made it."""

    n: int
    t: float
    via: str  # "Trigger" or "PartPresent"

    @property
    def ref(self) -> str:
        """The frame's ref, and LastResult.FrameId once its verdict is written."""
        return f"plc-{self.n}"


class EdgeBoard:
    """The pending edges of every PLC-triggered source (see module doc)."""

    def __init__(self, sources: list[str], max_pending: int):
        self._q: dict[str, collections.deque[Edge]] = {s: collections.deque() for s in sources}
        self._n = dict.fromkeys(sources, 0)
        self.refused = dict.fromkeys(sources, 0)  # pushes refused on a full queue
        self.accepted = dict.fromkeys(sources, 0)
        self._max = max_pending
        self._cond = threading.Condition()

    @property
    def sources(self) -> list[str]:
        """The names of the PLC-triggered sources."""
        return list(self._q)

    def push(self, source: str, via: str, t: float | None = None) -> Edge | None:
        """Queue an edge on `source`; None when its queue is full (refused, counted). Never
        blocks (called on the OPC UA server's event loop). KeyError for an unknown source."""
        with self._cond:
            q = self._q[source]
            if len(q) >= self._max:
                self.refused[source] += 1
                return None
            self._n[source] += 1
            self.accepted[source] += 1
            edge = Edge(self._n[source], time.time() if t is None else t, via)
            q.append(edge)
            self._cond.notify_all()
            return edge

    def take(self, source: str, timeout_s: float) -> Edge | None:
        """The oldest edge of `source`, waiting at most `timeout_s`; None when none came."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            q = self._q[source]
            while not q:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return q.popleft()

    def put_back(self, source: str, edge: Edge) -> None:
        """An edge taken whose capture failed: first again (it is not lost)."""
        with self._cond:
            self._q[source].appendleft(edge)
            self._cond.notify_all()

    def pending(self, source: str) -> int:
        """Edges of `source` waiting for their capture."""
        with self._cond:
            return len(self._q[source])
