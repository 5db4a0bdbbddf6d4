"""The coordinator's store: results exactly once, health history, events, fleet views, on
SQLite (a path; the embedded default) or PostgreSQL (a `postgresql://` URL).

`Store` owns the one dialect (dialect.py) it opens: the connection (or pool), the schema and
its migrations, the write lock and every transaction. Its rooms, each handed that dialect and
nothing of one another's but their public methods, do the jobs:

- ingest.py (`Ingest`): a batch stored in one transaction, exactly once; the acks computed
  from what is stored; the `devices` view rows and `result_counts` the batch moves;
- reads.py (`Reads`): results, acks, health (latest, history, timeline), events, states,
  views and the quarantine's record read back;
- budget.py (`Budget`): the fair shares (quotas.py) under the store's cap: `pool_usage`,
  admission before a batch is written, the deletes that free a device's pool, size;
- pruning.py (`Pruning`): retention's deletes by age and by size, and stalled streams.

What stays here is what belongs to the transaction owner: the portable writes, reads and
transactions other coordinator modules (rollout.py, bundles.py, alert_log.py, clock_place.py)
run on their own tables, the claims several coordinators race for, and the quarantine's
writes. Callers keep calling `Store`: its methods for the rooms' jobs are theirs, by name.

The SQL is written once, portably (`?` placeholders, `ON CONFLICT`), and what differs —
connections, DDL and migrations, exactly-once insert of results, locking, time partitions,
size — is in dialect.py. A method added in portable SQL works on both;
tests/coordinator/test_store_backends.py runs the store tests against both.
docs/fleet-scale.md says how the shares and the shared views work.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from runtime.coordinator.budget import Budget
from runtime.coordinator.dialect import READ_TIMEOUT_S, open_dialect
from runtime.coordinator.ingest import LAST_SEEN_WRITE_S, MAX_STREAMS_PER_DEVICE, Ingest
from runtime.coordinator.pruning import Pruning
from runtime.coordinator.quarantine_rows import DetailBudget
from runtime.coordinator.reads import Reads
from runtime.coordinator.store_rows import TIMELINE, Ack, Inbound, Stalled, query

# callers import these from here, where they always were
__all__ = ["LAST_SEEN_WRITE_S", "MAX_STREAMS_PER_DEVICE", "QUARANTINE_KEEP",
           "QUARANTINE_PER_DEVICE", "TIMELINE", "Ack", "Inbound", "Stalled", "Store"]

QUARANTINE_KEEP = 10_000  # rows of detail kept; the per-device counts are kept for ever
# and of one device's: a device flooding refused messages erases only its own record (was:
# every other device's too, past QUARANTINE_KEEP)
QUARANTINE_PER_DEVICE = 1000


def _room(room: str, method: Callable) -> Callable:
    """A Store method that is `method` of the room in `self.<room>` (its name, signature and
    docstring too)."""
    @functools.wraps(method)
    def call(self: Store, *args: Any, **kwargs: Any) -> Any:
        return method(getattr(self, room), *args, **kwargs)
    return call


class Store:
    """The coordinator's store on SQLite (a path) or PostgreSQL (a URL); thread-safe."""

    def __init__(self, path: str | Path, fsync: str = "normal", margin: float = 0.25,
                 read_timeout_s: float = READ_TIMEOUT_S):
        self._d = open_dialect(path, fsync, read_timeout_s)
        # (was: what devices over their share might borrow past the budget; admission now
        # sheds before write, so nothing is borrowed past it: kept for callers' signature)
        self.margin = margin
        self.backend = self._d.name
        self._budget = Budget(self._d)
        self._ingest = Ingest(self._d, self._budget)
        self._reads = Reads(self._d)
        self._pruning = Pruning(self._d, self._budget)
        self._detail = DetailBudget()  # detail rows of quarantine a device may add
        if self.backend == "sqlite":  # the raw connection, for tests that forge rows
            self.path, self._db, self._lock = self._d.path, self._d.db, self._d.lock

    # -- the rooms' jobs, under the names callers use -------------------------------------------

    ingest = _room("_ingest", Ingest.ingest)

    results = _room("_reads", Reads.results)
    results_page = _room("_reads", Reads.results_page)
    result_seqs = _room("_reads", Reads.result_seqs)
    counts = _room("_reads", Reads.counts)
    total_results = _room("_reads", Reads.total_results)
    acks = _room("_reads", Reads.acks)
    events = _room("_reads", Reads.events)
    states = _room("_reads", Reads.states)
    views = _room("_reads", Reads.views)
    changed_views = _room("_reads", Reads.changed_views)
    latest_health = _room("_reads", Reads.latest_health)
    health_history = _room("_reads", Reads.health_history)
    health_series = _room("_reads", Reads.health_series)
    quarantine_counts = _room("_reads", Reads.quarantine_counts)
    quarantined = _room("_reads", Reads.quarantined)

    used_bytes = _room("_budget", Budget.used_bytes)
    usage = _room("_budget", Budget.usage)
    pools = _room("_budget", Budget.pools)
    size_bytes = _room("_budget", Budget.size_bytes)
    take_shed = _room("_budget", Budget.take_shed)
    set_cap = _room("_budget", Budget.set_cap)

    prune = _room("_pruning", Pruning.prune)
    prune_results = _room("_pruning", Pruning.prune_results)
    quarantine_stalled = _room("_pruning", Pruning.quarantine_stalled)
    forget_memory_streams = _room("_pruning", Pruning.forget_memory_streams)

    def probe(self, now: float) -> None:
        """One small write the way a batch writes (a transaction that commits a row), so a
        store that failed is known to store again; raises what the store raises."""
        with self._d.transaction() as db:
            db.execute("INSERT INTO claims VALUES (?,?,?,?) ON CONFLICT (device, what) DO "
                       "UPDATE SET t = excluded.t", ("", "store-probe", "ok", now))

    @property
    def last_seen_write_s(self) -> float:
        """A device's `devices` row is not rewritten for a `last_seen` that moved less than
        this (seconds; the coordinator sets it from stale_after_s)."""
        return self._ingest.last_seen_write_s

    @last_seen_write_s.setter
    def last_seen_write_s(self, value: float) -> None:
        self._ingest.last_seen_write_s = value

    @property
    def refused_over_share(self) -> Counter:
        """Messages refused by the fair shares, per device (since the store was opened)."""
        return self._ingest.refused_over_share

    @property
    def over_budget(self) -> bool:
        """Whether the last batch found the devices over their budget."""
        return self._budget.over_budget

    @property
    def budget_bytes(self) -> int:
        """The devices' logical budget (set_cap; 0 = no cap)."""
        return self._budget.budget_bytes

    @property
    def overhead(self) -> float:
        """The store's bytes per logical byte as last measured (quotas.overhead)."""
        return self._budget.overhead

    @property
    def reclaimed(self) -> dict[str, dict[str, int]]:
        """What the last prune_results reclaimed from devices over their share: device ->
        {"results": n, "unacked": n, "health": n, "events": n, "before": B, "after": B}."""
        return self._pruning.reclaimed

    # -- what the transaction owner does itself -------------------------------------------------

    def quarantine(self, rows: Sequence[tuple[str, str, str, int, float]]) -> int:
        """Record refused messages: (device or "", topic, reason, size in bytes, time).
        Every one is counted; detail rows go through the devices' DetailBudget (a burst,
        then a rate: past it one summary row a call stands for the rest) and are capped at
        QUARANTINE_PER_DEVICE per device and QUARANTINE_KEEP in all (newest kept); counts
        are kept for ever. Returns how many got no detail row of their own."""
        if not rows:
            return 0
        per_device: dict[str, int] = {}
        for device, *_ in rows:
            per_device[device[:64]] = per_device.get(device[:64], 0) + 1
        detail, left_out = self._detail.sample([(d[:64], *rest) for d, *rest in rows])
        oc = self._d.order_col
        with self._d.transaction() as db:
            db.executemany(
                "INSERT INTO quarantine (device, topic, reason, size, t) VALUES (?,?,?,?,?)",
                [(d, topic[:256], reason[:500], int(size), float(t))
                 for d, topic, reason, size, t in detail])
            db.executemany(
                "INSERT INTO quarantine_counts VALUES (?,?) "
                "ON CONFLICT(device) DO UPDATE SET n = quarantine_counts.n + excluded.n",
                sorted(per_device.items()))
            for device in sorted(per_device):  # each device's own newest, first
                db.execute(f"DELETE FROM quarantine WHERE device = ? AND {oc} <= (SELECT {oc} "
                           f"FROM quarantine WHERE device = ? ORDER BY {oc} DESC LIMIT 1 "
                           "OFFSET ?)", (device, device, QUARANTINE_PER_DEVICE))
            # by count, not by id distance: the trims above leave holes in the ids
            db.execute(f"DELETE FROM quarantine WHERE {oc} <= (SELECT {oc} FROM quarantine "
                       f"ORDER BY {oc} DESC LIMIT 1 OFFSET ?)", (QUARANTINE_KEEP,))
        return left_out

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """A portable write (`?` placeholders) of `rows` in one transaction: the coordinator's
        own tables (device_groups, desired, rollouts: runtime/coordinator/rollout.py)."""
        with self._d.transaction() as db:
            db.executemany(sql, rows)

    def claim(self, device: str, what: str, state: str, t: float,
              window_s: float = 60.0) -> bool:
        """Whether this coordinator is the first of those sharing the store to act on `what`
        of `device` reaching `state` (an alert transition: `alert:hot` "raised"; a birth:
        `birth` "<boot>@<t>"): each coordinator sees the same, and the webhook's receiver
        or the device must get it once. The same state again within `window_s` is another
        coordinator's duplicate; after that it is a new one (e.g. an alert's clear was
        missed while every coordinator was down)."""
        return self.claim_many([(device, what, state, t)], window_s)[0]

    def claim_many(self, items: Sequence[tuple[str, str, str, float]], window_s: float = 60.0
                   ) -> list[bool]:
        """`claim` for many (device, what, state, t) in one transaction (a refresh's alert
        transitions, a batch's births): for each, whether this coordinator is the first.
        The same rule as `claim`, row by row; the rows are taken in (device, what) order so
        two coordinators claiming overlapping sets cannot deadlock (retried if one does),
        and an item repeated in the list is decided after the one before it."""
        if not items:
            return []
        for attempt in range(3):
            try:
                with self._d.transaction() as db:
                    won: list[bool] = [False] * len(items)
                    pending = sorted(range(len(items)), key=lambda i: items[i][:2])
                    while pending:  # rounds: a key at most once per statement
                        seen: set[tuple[str, str]] = set()
                        now_, later = [], []
                        for i in pending:
                            (later if items[i][:2] in seen else now_).append(i)
                            seen.add(items[i][:2])
                        rows = [(items[i][0], items[i][1], items[i][2], float(items[i][3]))
                                for i in now_]
                        got = self._d.claim_rows(db, rows, float(window_s))
                        for i in now_:
                            won[i] = items[i][:2] in got
                        pending = later
                    return won
            except self._d.retryable:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """One write transaction for several portable statements (`?` placeholders;
        `.execute(sql, args)` returns a cursor): committed when the block ends, rolled back
        when it raises (the bundle shelf deletes a bundle's row and its chunk rows in one)."""
        with self._d.transaction() as db:
            yield db

    def update(self, sql: str, args: Sequence[Any]) -> int:
        """A portable single statement in one transaction; returns the rows it changed
        (rollout.py's compare-and-swap of a rollout)."""
        with self._d.transaction() as db:
            return db.execute(sql, tuple(args)).rowcount

    def read(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        """A portable query's rows."""
        return self._query(sql, args)

    def read_in(self, sql: str, keys: Sequence[str]) -> list[tuple]:
        """A portable query ending in a text column, matched against any of `keys` (one array
        parameter on PostgreSQL, a parameter each on SQLite: keep `keys` to a few hundred)."""
        match, args = self._d.in_list(keys)
        return self._query(sql + match, args)

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        return query(self._d, sql, args)

    def maintain(self) -> None:
        """Create the time partitions ahead (PostgreSQL; run at least daily)."""
        self._d.maintain()

    @property
    def order_col(self) -> str:
        """The column giving health, events and quarantine rows their order and identity
        (rowid on SQLite, id on PostgreSQL), for portable statements naming one row."""
        return self._d.order_col

    def close(self) -> None:
        """Close the database (or the connection pool)."""
        self._d.close()
