"""The dashboard's alert transitions, kept in the store so every coordinator shows the same.

Each alert transition (raised / cleared, the webhook's body: alerting.py `_emit_alert`) is
written once (queued, and written in one batch at the end of each fleet refresh), by the
coordinator that claims it (with several coordinators on one store every
one computes every transition from the shared fleet view; `Store.claim` picks the first),
into `alert_log` (the newest KEEP rows are kept) and counted in `alert_counts` (kept for
ever). `recent` and `counts` read them back: a coordinator started a minute ago lists the
transitions of the last days, not only the ones it saw itself.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.coordinator.store import Store

KEEP = 1000  # transitions kept in the store (the dashboard lists 50)


class AlertLog:
    """Alert transitions in the store's `alert_log` and `alert_counts` tables."""

    def __init__(self, store: Store, keep: int = KEEP):
        self._store, self.keep = store, keep
        self._queue: list[dict[str, Any]] = []  # added, not yet written (see flush)

    def add(self, body: dict[str, Any]) -> None:
        """Queue one transition (a webhook alert body: t, device, alert, state, ...); `flush`
        writes the queue (a fleet going stale at once is a few transactions, not thousands)."""
        self._queue.append(body)
        if len(self._queue) > 10 * self.keep:  # the store down for long: bounded memory
            del self._queue[:-10 * self.keep]

    def flush(self) -> int:
        """Write the queued transitions (three statements in all); returns how many. On a
        store error they stay queued for the next flush."""
        if not self._queue:
            return 0
        queued = self._queue
        per_state: dict[str, int] = {}
        for b in queued:  # every transition counted; the newest `keep` listed
            state = str(b.get("state", ""))[:16]
            per_state[state] = per_state.get(state, 0) + 1
        rows = [(float(b["t"]), str(b["device"])[:64], str(b["alert"])[:64],
                 str(b.get("state", ""))[:16], json.dumps(b)) for b in queued[-self.keep:]]
        self._store.write("INSERT INTO alert_log (t, device, code, state, body) "
                          "VALUES (?,?,?,?,?)", rows)
        self._queue = []  # written: a failure of the two below must not write them twice
        self._store.write("INSERT INTO alert_counts VALUES (?, ?) ON CONFLICT(state) "
                          "DO UPDATE SET n = alert_counts.n + excluded.n",
                          sorted(per_state.items()))
        # bounded: the oldest go (t is indexed)
        self._store.write("DELETE FROM alert_log WHERE t < (SELECT t FROM alert_log ORDER BY "
                          "t DESC LIMIT 1 OFFSET ?)", [(self.keep - 1,)])
        return len(queued)

    def recent(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest transitions, newest first (a row that does not decode is left out)."""
        out = []
        for (body,) in self._store.read("SELECT body FROM alert_log ORDER BY t DESC LIMIT ?",
                                        (int(limit),)):
            try:
                doc = json.loads(body)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def counts(self) -> dict[str, int]:
        """Transitions recorded since the store was made, per state (raised, cleared)."""
        return {s: int(n) for s, n in self._store.read("SELECT state, n FROM alert_counts")}

    def raised_times(self) -> dict[tuple[str, str], float]:
        """(device, code) -> when it was last raised, over the kept log (one query): the
        `since` of an alert raised by another coordinator, or before this one started."""
        return {(d, c): float(t) for d, c, t in self._store.read(
            "SELECT device, code, MAX(t) FROM alert_log WHERE state='raised' "
            "GROUP BY device, code")}

    def open_raises(self) -> dict[tuple[str, str], str]:
        """(device, code) -> message of each alert whose newest transition in the kept log is
        a raise (one query over at most `keep` rows): raised and not told cleared. The log
        keeps the newest rows, so a later clear is never pruned before its raise."""
        newest: dict[tuple[str, str], tuple[str, str]] = {}
        for d, c, state, body in self._store.read(
                "SELECT device, code, state, body FROM alert_log ORDER BY t"):
            newest[(d, c)] = (state, body)
        out = {}
        for key, (state, body) in newest.items():
            if state == "raised":
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                out[key] = str(doc.get("message", "")) if isinstance(doc, dict) else ""
        return out

    def complete_since(self) -> float:
        """The time from which the kept log holds every transition (-inf: none was ever
        pruned; else its oldest row's)."""
        ((n, oldest),) = self._store.read("SELECT COUNT(*), MIN(t) FROM alert_log")
        return -math.inf if int(n) < self.keep or oldest is None else float(oldest)
