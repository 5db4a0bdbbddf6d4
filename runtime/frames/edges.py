"""PLC edges waiting for their capture: one bounded FIFO per PLC-triggered source.

The OPC UA server (runtime/telemetry/opcua_server.py) pushes an edge for each Trigger() call
and each PartPresent false->true, the Modbus server (runtime/telemetry/modbus_server.py) for
each PartPresent coil false->true and each new part counter value; the source's capture
thread (sources.EdgeTriggered) takes them in order, one frame each. An edge is never dropped
once accepted: a full queue refuses the push (the PLC is told, the refusal counted), and an
edge whose capture failed is put back at the front for the next try. Thread-safe; no I/O.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass


def rising(old: bool, new: bool) -> bool:
    """Whether a PartPresent going from `old` to `new` is an edge (false -> true only)."""
    return new and not old


def new_count(old: int, new: int) -> bool:
    """Whether a part counter the PLC writes going from `old` to `new` is an edge: any new
    value (the PLC counts up and wraps; writing the same value again is no new part)."""
    return new != old


@dataclass(frozen=True)
class Edge:
    """One rising edge of the PLC: its number on its source (1, 2, ...; the frame is
    `plc-<n>`), when it arrived (wall time: the frame's time) and what made it."""

    n: int
    t: float
    via: str  # "Trigger" or "PartPresent" (OPC UA); "PartPresent" or "PartSeq" (Modbus)

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


class EdgeBoards:
    """Several boards seen as one by the sources (each source's edges come from one server:
    OPC UA or Modbus): `sources`, `take`, `put_back`, `pending` go to the source's board."""

    def __init__(self, boards: list[EdgeBoard]):
        self._of = {s: b for b in boards for s in b.sources}

    @property
    def sources(self) -> list[str]:
        """The names of the PLC-triggered sources, every board's."""
        return list(self._of)

    def take(self, source: str, timeout_s: float) -> Edge | None:
        """The oldest edge of `source` (EdgeBoard.take)."""
        return self._of[source].take(source, timeout_s)

    def put_back(self, source: str, edge: Edge) -> None:
        """EdgeBoard.put_back on the source's board."""
        self._of[source].put_back(source, edge)

    def pending(self, source: str) -> int:
        """EdgeBoard.pending on the source's board."""
        return self._of[source].pending(source)
