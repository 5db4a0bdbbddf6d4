"""When the ingest loop's group commit ends (pure: no clock, no store).

Every store transaction writes whole pages (WAL and checkpoint: the results' leaf, the
stream's ack row, the counters, page 1), however few rows it holds, so the fewer
transactions the fewer bytes a result costs the disk (docs/telemetry.md, "Disk writes").
But acks leave only with the transaction, and a device stops publishing past its `inflight`
unacked results: a window long enough for a device at 10 results/s to share one
transaction among ~20 results would starve one at 100/s. So the window ends at its length
or as soon as one device has `results_cap` results in it, whichever comes first, and at once
for the messages someone waits on (a birth, a command's reply): health and events are not
awaited by anyone, and are coalesced anyway.
"""

from __future__ import annotations

from collections import Counter

from runtime.wire import payloads

# kinds that may wait for the window's end; any other ends it at once
_MAY_WAIT = frozenset({"result", "health", "event"})


def window_s(configured_s: float, stale_after_s: float) -> float:
    """The group commit's length: `configured_s`, but at most an eighth of `stale_after_s`.
    A device's messages reach the fleet view (this coordinator's and, through the store,
    the others') only when their window ends, so a device talking all the time looks
    silent for up to a window: a 2 s window under a 2 s `stale_after_s` called a live device
    stale. An eighth leaves the rest for the health coalescing, the `last_seen` row delay
    (a quarter: service.py) and a loaded host."""
    return min(configured_s, stale_after_s / 8)


def results_in(raw: bytes) -> int:
    """About how many results a result message holds: its `"seq"` keys, counted, not
    parsed (this only decides when a transaction starts; the store parses it)."""
    return max(1, raw.count(b'"seq"'))


class WindowCount:
    """The messages of one open window, counted to decide whether it ends early."""

    def __init__(self, results_cap: int):
        self.results_cap = results_cap  # 0: no early end for results
        self._results: Counter = Counter()  # device -> results in the window

    def add(self, topic: str, raw: bytes) -> bool:
        """Count one message in; True when the window should end now."""
        parsed = payloads.parse_topic(topic)
        if parsed is None:  # not an edgerun topic: quarantined, nobody waits on it
            return False
        _, device, kind = parsed
        if kind not in _MAY_WAIT:
            return True
        if kind != "result":
            return False
        self._results[device] += results_in(raw)
        return 0 < self.results_cap <= self._results[device]
