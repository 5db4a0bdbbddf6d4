"""The store watched from outside the thread that waits on it: a commit that hangs, a store
that fails. Pure apart from its lock: the caller passes the times (the coordinator's
monotonic clock, `Coordinator.mono`), so it is tested with simulated time.

A store that hangs (a disk frozen under it, a PostgreSQL pool waiting 30 s for a connection)
left the ingest thread stuck in a commit without a word: nothing logged, and the fleet view
aged every device stale, then offline, although all of them were sending. And a store that
fails was an ERROR line and a counter. Now:

- the ingest thread marks each store batch `begin` and `end` (with the error when it failed),
  and its housekeeping between batches (a fleet refresh, the hourly prune) too: hung on the
  store, it holds ingest as a batch does (a batch with nothing to store, or housekeeping,
  never says a failing store is back);
- a watchdog thread calls `check` every second: a batch in flight longer than
  `stall_after_s` is logged as an ERROR naming the store and how long, again at most once a
  `repeat_s`, and its end is logged when it comes;
- `status` (stats, the alerts view, /metrics) and `alert` (the coordinator's own `store`
  alert, raised and cleared through alerting.py) say `stalled` or `failing` with the cause;
- while failing, once `probe_s` passed without a batch that failed or stored, `probe_due`
  asks the ingest thread for one small write (Store.probe): in an idle fleet nothing else
  told that the store was back, and the `store` alert stayed raised until the next stored
  batch, however long the fleet stayed quiet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Said:
    """A line for the coordinator's log: its level and text."""

    level: int
    text: str


class StoreWatch:
    """One store's commits, watched (see module docstring). Thread-safe."""

    def __init__(self, store: str, stall_after_s: float, repeat_s: float = 60.0,
                 probe_s: float = 5.0):
        self.store, self.stall_after_s, self.repeat_s = store, stall_after_s, repeat_s
        self.probe_s = probe_s  # a failing store is probed after this long without word
        self._told: float | None = None  # the last end that failed or stored
        self._lock = threading.Lock()
        self._since: float | None = None  # the batch in flight began then
        self._what = "a batch"  # what is in flight (begin)
        self._warned: float | None = None  # the last stall line of that batch
        self._failing: tuple[float, str] | None = None  # (since, cause) while batches fail
        self.stalls = 0  # batches that were in flight past stall_after_s
        self.longest_s = 0.0  # the longest batch in flight seen

    def begin(self, now: float, what: str = "a batch") -> None:
        """The ingest thread starts storing a batch (or `what` else of the store's work
        that holds ingest: its housekeeping)."""
        with self._lock:
            self._since, self._warned, self._what = now, None, what

    def end(self, now: float, error: str | None = None, stored: bool = True) -> list[Said]:
        """The batch begun last is done (`error`: why it failed; `stored`: False when it had
        nothing to store, so it cannot say a failing store is back); what to log about it:
        the end of a stall that was logged, a store failing again, a failing store back."""
        out = []
        with self._lock:
            since, warned, self._since, self._warned = self._since, self._warned, None, None
            took = 0.0 if since is None else now - since
            self.longest_s = max(self.longest_s, took)
            if error is not None or stored:
                self._told = now
            if warned is not None:
                done = "failed" if error else "stored" if stored else "done"
                out.append(Said(logging.WARNING, f"store {self.store}: {self._what} in flight "
                                f"for {took:.1f} s completed ({done})"))
            if error is not None:
                if self._failing is None:
                    self._failing = (now, error[:300])
                else:  # the first failure's time, the latest cause
                    self._failing = (self._failing[0], error[:300])
            elif self._failing is not None and stored:
                out.append(Said(logging.WARNING, f"store {self.store}: stores again after "
                                f"failing for {now - self._failing[0]:.0f} s"))
                self._failing = None
        return out

    def check(self, now: float) -> list[Said]:
        """What to log now about a batch in flight (the watchdog's tick): one ERROR once it
        passes stall_after_s, then one each repeat_s while it stays."""
        with self._lock:
            if self._since is None:
                return []
            took = now - self._since
            if took <= self.stall_after_s:
                return []
            if self._warned is not None and now - self._warned < self.repeat_s:
                return []
            if self._warned is None:
                self.stalls += 1
            self._warned, what = now, self._what
        return [Said(logging.ERROR, f"store {self.store}: {what} has been in flight for "
                     f"{took:.0f} s (stall_after_s {self.stall_after_s:g}): ingest waits on "
                     "the store; devices' messages wait in the inbox, nothing is acked")]

    def probe_due(self, now: float) -> bool:
        """Whether the failing store should be probed now: failing, nothing in flight, and
        nothing failed or stored for `probe_s` (a fleet sending keeps telling by itself)."""
        with self._lock:
            return (self._failing is not None and self._since is None
                    and now - (self._told if self._told is not None else self._failing[0])
                    >= self.probe_s)

    def probe(self, clock: Callable[[], float], write: Callable[[], Any]) -> list[Said]:
        """When probe_due: `write` (one small write to the store) run as a batch, watched,
        its failure keeping the store failing with the latest cause. In an idle fleet the
        `store` alert stayed raised after the store recovered, until the next stored
        batch. `clock`: the watch's monotonic time."""
        if not self.probe_due(clock()):
            return []
        self.begin(clock(), "a probe of the failing store")
        try:
            write()
        except Exception as e:
            return self.end(clock(), f"{type(e).__name__}: {e}")
        return self.end(clock())

    def busy(self, now: float, over_s: float = 1.0) -> bool:
        """Whether a batch has been in flight for more than `over_s`: the store may hang,
        so what would write to it from an API request goes to a thread of its own."""
        with self._lock:
            return self._since is not None and now - self._since > over_s

    def status(self, now: float) -> dict[str, Any]:
        """{state: ok | stalled | failing, for_s, cause, in_flight_s, stall_after_s, stalls,
        longest_s}: stalled while a batch is in flight past stall_after_s, failing while
        the last batch failed (since the first failure of the run)."""
        with self._lock:
            in_flight = None if self._since is None else now - self._since
            state, for_s, cause = "ok", 0.0, ""
            if in_flight is not None and in_flight > self.stall_after_s:
                state, for_s = "stalled", in_flight
                cause = f"{self._what} in flight for {in_flight:.0f} s"
            elif self._failing is not None:
                state, for_s, cause = "failing", now - self._failing[0], self._failing[1]
            return {"state": state, "for_s": round(for_s, 3), "cause": cause,
                    "in_flight_s": None if in_flight is None else round(in_flight, 3),
                    "stall_after_s": self.stall_after_s, "stalls": self.stalls,
                    "longest_s": round(self.longest_s, 3)}

    def alert(self, now: float) -> dict[str, str]:
        """The coordinator's own alerts now: {"store": message} while stalled or failing."""
        s = self.status(now)
        if s["state"] == "ok":
            return {}
        return {"store": f"store {self.store} {s['state']} for {s['for_s']:.0f} s: "
                         f"{s['cause']}"}
