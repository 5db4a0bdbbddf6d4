"""The coordinator store read back: results and acks, health (the latest, a history, the
dashboard's timeline), events, states, fleet views and the quarantine's record.

Every read is one portable query through the store's dialect (its reader: on PostgreSQL a
pooled connection, on SQLite the one connection under its lock); nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from runtime.coordinator import fleet
from runtime.coordinator.store_rows import TIMELINE, Dialect, query, view_from_json

_TIMELINE_COLS = {name for name, _ in TIMELINE}
_AGGREGATES = {"MIN", "MAX", "AVG"}


class Reads:
    """What the coordinator, its HTTP API and its tools read of the store (see module
    docstring)."""

    def __init__(self, d: Dialect):
        self._d = d

    def _query(self, sql: str, args: Sequence = ()) -> list[tuple]:
        return query(self._d, sql, args)

    def quarantine_counts(self) -> dict[str, int]:
        """Quarantined messages per device ("" = topic named no valid device)."""
        return dict(self._query("SELECT device, n FROM quarantine_counts"))

    def quarantined(self, device: str | None = None, limit: int = 50) -> list[dict]:
        """The newest quarantined messages (all devices, or one), newest first."""
        where, args = ("WHERE device=?", (device,)) if device is not None else ("", ())
        rows = self._query(f"SELECT t, device, topic, reason, size FROM quarantine {where} "
                           f"ORDER BY {self._d.order_col} DESC LIMIT ?", (*args, limit))
        return [{"t": t, "device": d, "topic": tp, "reason": r, "size": n}
                for t, d, tp, r, n in rows]

    def results(self, device: str, after_seq: int = 0, limit: int = 1000) -> list[dict]:
        """Stored results of a device (all streams), oldest stream first, in seq order; here
        and below a refused item's marker (boot "": ingest.marker_row) is left out."""
        rows = self._query("SELECT stream, boot, body FROM results WHERE device=? AND seq > ? "
                           "AND boot <> '' "
                           "ORDER BY received, seq LIMIT ?", (device, after_seq, limit))
        return [{**json.loads(b), "stream": s, "boot": bt} for s, bt, b in rows]

    def results_page(self, device: str, cursor: tuple[str, int] | None = None,
                     limit: int = 1000) -> tuple[list[dict], tuple[str, int] | None]:
        """One page of a device's results in (stream, seq) order, strictly after `cursor`;
        returns (rows, next cursor). Keyset paging on the primary key: no row is skipped or
        repeated however streams interleave. The next cursor is the last row's (or the given
        one when the page is empty, so a client can keep polling from it)."""
        if cursor is None:
            rows = self._query("SELECT stream, seq, boot, body FROM results WHERE device=? "
                               "AND boot <> '' ORDER BY stream, seq LIMIT ?", (device, limit))
        else:
            rows = self._query("SELECT stream, seq, boot, body FROM results WHERE device=? "
                               "AND (stream, seq) > (?, ?) AND boot <> '' ORDER BY stream, seq "
                               "LIMIT ?",
                               (device, cursor[0], cursor[1], limit))
        page = [{**json.loads(b), "stream": s, "boot": bt} for s, _, bt, b in rows]
        return page, ((rows[-1][0], rows[-1][1]) if rows else cursor)

    def result_seqs(self, device: str) -> list[tuple[str, int]]:
        """(stream, seq) of every stored result of a device, in seq order per stream (a
        refused item's marker, boot "", is no result: ingest.marker_row)."""
        return self._query("SELECT stream, seq FROM results WHERE device=? AND boot <> '' "
                           "ORDER BY stream, seq", (device,))

    def counts(self) -> dict[str, int]:
        """Stored results per device (the maintained `result_counts`, not a GROUP BY)."""
        return dict(self._query("SELECT device, n FROM result_counts WHERE n > 0"))

    def total_results(self) -> int:
        """Stored results over all devices (from `result_counts`)."""
        (n,), = self._query("SELECT COALESCE(SUM(n), 0) FROM result_counts")
        return int(n)

    def acks(self) -> dict[tuple[str, str], int]:
        """The current ack per (device, stream)."""
        return {(d, s): a for d, s, a in self._query("SELECT device, stream, acked FROM streams")}

    def events(self, device: str, limit: int = 50) -> list[dict]:
        """Latest events of a device, newest first."""
        return [json.loads(b) for (b,) in self._query(
            "SELECT body FROM events WHERE device=? ORDER BY t DESC LIMIT ?", (device, limit))]

    def states(self) -> dict[str, dict]:
        """The last state message of every device (to rebuild the fleet view at start)."""
        return {d: json.loads(b) for d, b in self._query("SELECT device, body FROM states")}

    def views(self, since: float | None = None) -> dict[str, fleet.DeviceView]:
        """The fleet view every coordinator sharing this store maintains (`devices`), before
        ageing and alerts (fleet.refresh); with `since`, only rows updated after it (by the
        writing coordinator's clock). A row that does not decode is left out."""
        out = {}
        where, args = ("WHERE updated > ?", (since,)) if since is not None else ("", ())
        for d, body in self._query(f"SELECT device, view FROM devices {where}", args):
            v = view_from_json(d, body)
            if v is not None:
                out[d] = v
        return out

    def changed_views(self, since: float | None, seen: dict[str, float]
                      ) -> dict[str, fleet.DeviceView]:
        """`views(since)` without the rows whose `updated` stamp is the one in `seen` (already
        read, or written by this process: Store.ingest's `written`), so a refresh decodes
        each row once per change, not on every read of its window; `seen` is updated."""
        out = {}
        where, args = ("WHERE updated > ?", (since,)) if since is not None else ("", ())
        for d, updated, body in self._query(
                f"SELECT device, updated, view FROM devices {where}", args):
            if seen.get(d) == updated:
                continue
            v = view_from_json(d, body)
            if v is not None:
                out[d] = v
                seen[d] = updated
        return out

    def latest_health(self) -> dict[str, dict]:
        """The newest health of every device."""
        rows = self._query("SELECT h.device, h.body FROM health h JOIN (SELECT device, "
                           "MAX(t) AS t FROM health GROUP BY device) m "
                           "ON m.device = h.device AND m.t = h.t")
        return {d: json.loads(b) for d, b in rows}

    def health_history(self, device: str, since: float, until: float, limit: int
                       ) -> list[dict]:
        """A device's health in [since, until], oldest first, as the reduced records
        `edgerun report` plots (runtime/wire/health_history.record); more than `limit` are thinned
        to `limit` evenly spread ones (a day at 5 s is 17 280)."""
        from runtime.wire.health_history import record

        rows = self._query("SELECT body FROM health WHERE device=? AND t >= ? AND t <= ? "
                           "ORDER BY t", (device, since, until))
        if len(rows) > limit:
            step = len(rows) / limit
            rows = [rows[int(i * step)] for i in range(limit)]
        out = []
        for (body,) in rows:
            try:
                out.append(record(json.loads(body)))
            except (ValueError, AttributeError):  # stored before validation existed: skip it
                continue
        return out

    def health_series(self, device: str, since: float, until: float,
                      columns: Sequence[tuple[str, str]], max_points: int = 600
                      ) -> list[tuple]:
        """A device's timeline between `since` and `until` (device clock) in at most
        `max_points` time buckets, oldest first: one row per bucket holding its newest `t`
        and, per (TIMELINE column, "MIN" | "MAX" | "AVG") in `columns`, that aggregate over
        the bucket (NULL where the field was absent)."""
        for name, agg in columns:
            if name not in _TIMELINE_COLS or agg not in _AGGREGATES:
                raise ValueError(f"no timeline column {agg}({name})")
        width = max((until - since) / max(1, max_points), 1e-3)
        cols = ", ".join(f"{agg}({name})" for name, agg in columns)
        # the bucket number truncated (t >= since): PostgreSQL's CAST rounds, so FLOOR there
        bucket = ("CAST((t - ?) / ? AS INTEGER)" if self._d.name == "sqlite"
                  else "FLOOR((t - ?) / ?)")
        return self._query(
            f"SELECT MAX(t), {cols} FROM health_points WHERE device=? AND t >= ? AND t <= ? "
            f"GROUP BY {bucket} ORDER BY 1",
            (device, since, until, since, width))
