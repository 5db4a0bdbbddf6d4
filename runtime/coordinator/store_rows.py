"""What the coordinator store's rooms share: the messages and acks they pass, the rows they
read back, and the accounting of logical bytes every write and delete keeps.

The store (store.py) opens one dialect (dialect.py): the one object that owns the connection
(or pool), the write lock, the schema and every transaction. Each room — ingest.py (results,
acks, fleet views), reads.py (results, health and events read back), budget.py (the fair
shares and the deletes they make), pruning.py (retention) — is handed that dialect and opens
its transactions through it; none keeps a connection or a transaction of its own.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from runtime.coordinator import fleet
from runtime.coordinator.dialect import PostgresDialect, SQLiteDialect

# The transaction owner the rooms are handed (store.py opens it, once).
Dialect = SQLiteDialect | PostgresDialect

# clock_place.py's boots waiting to be placed, a row each. stream/lo/hi: where the unplaced
# rows are, so settling reads a range of an index (results: stream and first seq; health and
# events: first and last claimed t); seen: the coordinator's time it was noted, for pruning.
# Retention reads it too: a claim before 2025 is kept while its device has a boot pending
# (pruning.py).
PENDING_DDL = ("CREATE TABLE IF NOT EXISTS clock_pending (device TEXT NOT NULL, "
               "boot TEXT NOT NULL, kb TEXT NOT NULL, stream TEXT, lo DOUBLE PRECISION, "
               "hi DOUBLE PRECISION, seen DOUBLE PRECISION, PRIMARY KEY (device, boot))")
# a pending boot's highest claimed t is written again only when this much later (clock_place)
PENDING_WIDEN_S = 3600.0

# The dashboard's timeline (health_points): column <- path in the health message. Numbers
# only, copied at ingest so a week of a device's timeline is read without parsing JSON.
TIMELINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("temp_c", ("temp_c",)), ("passive_trip_c", ("passive_trip_c",)), ("rung", ("rung",)),
    ("rungs", ("rungs",)), ("p95_ms", ("pipeline", "latency_ms", "p95")),
    ("target_ms", ("slo", "target_ms")), ("rate_hz", ("pipeline", "rate_hz")),
    ("accuracy", ("accuracy",)), ("power_w", ("power_w",)),
    ("rung_energy_mj", ("rung_energy_mj",)), ("battery_frac", ("battery_frac",)),
    ("harvest_w", ("harvest_w",)))


@dataclass(frozen=True)
class Inbound:
    """One validated message to store: its device, kind and payload."""

    device: str
    kind: str  # result | health | event | state
    msg: dict
    size: int = 0  # its bytes on the wire (0: estimated from msg when a quota needs it)
    # a result message's refused items (seq, reason, bytes): their seqs stored as refusal
    # markers, done for the ack (result_items.py); its valid items are in msg["results"]
    refused: tuple[tuple[int, str, int], ...] = ()


def marker_row(device: str, stream: str, seq: int, why: str, now: float) -> tuple:
    """The `results` row that marks a refused item's seq as done (result_items.py): under
    the result's own key, so exactly-once, the ack, the fair shares and retention treat it
    as any row. Its boot is "" (a result's never is: an id of 1-64 characters), which is
    how reads leave it out; its `t` is when it was received."""
    # the JSON json.dumps writes, by hand: 7x cheaper, and a message of 10,000 refused
    # items builds each marker twice (its charge, then its row)
    return (device, stream, seq, "", now, now,
            f'{{"seq":{seq:d},"refused":{encode_basestring_ascii(why[:300])}}}')


@dataclass(frozen=True)
class Stalled:
    """A stream quarantined by retention: its ack stopped and its rows above it were
    deleted (the device still holds them: it deletes only what an ack covers)."""

    device: str
    stream: str
    acked: int
    rows: int
    bytes: int
    since: float


@dataclass(frozen=True)
class Ack:
    """What the coordinator vouches for: every seq in [first, seq] of `stream` is stored."""

    stream: str
    first: int
    seq: int


def query(d: Dialect, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
    """A portable query's rows, read through the dialect's reader."""
    with d.reader() as db:
        return [tuple(r) for r in db.execute(sql, tuple(args)).fetchall()]


def charge(db: Any, size: Counter) -> None:
    """Add logical bytes stored to each (device, pool) of `size`."""
    if rows := sorted((d, p, int(n)) for (d, p), n in size.items() if n):
        db.executemany("INSERT INTO pool_usage VALUES (?,?,?) ON CONFLICT(device, pool) "
                       "DO UPDATE SET bytes = pool_usage.bytes + excluded.bytes", rows)


def uncharge(db: Any, size: Counter) -> None:
    """Take logical bytes deleted off each (device, pool) of `size`."""
    if size:
        db.executemany("UPDATE pool_usage SET bytes = bytes - ? WHERE device = ? AND pool = ?",
                       [(int(n), d, p) for (d, p), n in sorted(size.items()) if n])


VIEW_FIELDS = tuple(f for f in fleet.DeviceView.__dataclass_fields__
                    if f not in ("status", "alerts"))


def view_to_json(v: fleet.DeviceView) -> str:
    """A device's merged view as its `devices` row stores it."""
    # a shallow dict (dataclasses.asdict deep-copies: it was most of ingest's time)
    return json.dumps({f: getattr(v, f) for f in VIEW_FIELDS}, separators=(",", ":"))


def view_from_json(device: str, body: str) -> fleet.DeviceView | None:
    """A stored view back to a DeviceView; None (start afresh) when the row is not one."""
    try:
        d = json.loads(body)
        if not isinstance(d, dict) or not d:
            return None
        fields = {k: d[k] for k in VIEW_FIELDS if k in d and k != "device"}
        # the status from the fields (as `replace` after construction did, at half the cost:
        # every refresh decodes the rows other coordinators wrote)
        return fleet.DeviceView(device, status="online" if fields.get("online") else
                                "asleep" if fields.get("asleep") else "offline", **fields)
    except (ValueError, TypeError):
        return None
