"""What differs between the store's two databases: SQLite (embedded default) and PostgreSQL.

`Store` (store.py and its rooms) writes its SQL once, portably: `?` placeholders (`%s` for
psycopg), `INSERT ... ON CONFLICT ... DO NOTHING / DO UPDATE` (both engines), no `rowid`
(the dialect names the row-order column). Everything engine-specific lives here: connecting
(one WAL connection vs a psycopg pool), DDL and versioned migrations (a `schema_version`
table, applied at start under a lock), how a batch of results is inserted exactly once,
locking a batch's devices, time partitions and dropping them, and the size query.

PostgreSQL layout: `results` is range-partitioned by `received` (coordinator clock, one
partition per UTC day, created ahead, plus a default partition for anything outside), so
retention drops whole days instead of deleting rows. A partitioned table cannot have a
unique index that leaves out the partition key, so uniqueness of (device, stream, seq)
lives in a narrow unpartitioned `result_keys` table: a batch reads which of its keys are
there, under its devices' locks, and inserts the others' keys and rows.
Acks read `result_keys`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from runtime.coordinator.quotas import EVENT_BYTES_SQL, HEALTH_BYTES_SQL, RESULT_BYTES_SQL
from runtime.coordinator.sqlite_schema import POOL_USAGE, SQLITE_MIGRATIONS, SQLITE_SCHEMA
from runtime.coordinator.store_open import (
    StoreError,
    StoreRefused,
    StoreUnreachable,
    check_wal,
    newer_schema,
    sqlite_open_refusal,
    where,
)
from runtime.durable import make_dir

log = logging.getLogger("edgerun.coordinator")

DAY = 86400.0


# -- SQLite (its schema: sqlite_schema.py) -------------------------------------------------

# Store.claim: a claim is won when its row is new, or holds another state, or the same state
# from longer than the window ago (see Store.claim)
_CLAIM = ("INSERT INTO claims VALUES (?,?,?,?) ON CONFLICT(device, what) DO UPDATE SET "
          "state = excluded.state, t = excluded.t WHERE claims.state <> excluded.state "
          "OR claims.t < excluded.t - ?")


class SQLiteDialect:
    """One writing connection in WAL mode, serialised by a lock; `BEGIN IMMEDIATE` makes each
    write transaction exclusive, which is also what orders several coordinators on one file.
    Reads have a query_only connection and lock of their own (`reader`)."""

    name = "sqlite"
    order_col = "rowid"  # insertion order of health, events, quarantine
    keys_table = "results"  # where (device, stream, seq) is unique

    def __init__(self, path: str | Path, fsync: str = "normal"):
        self.path = Path(path).expanduser()
        self.lock = threading.Lock()
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        self.retryable: tuple[type[BaseException], ...] = ()
        # Whatever stops the store opening is one StoreError naming the file and why: each
        # was a traceback at every restart (a file in the directory's place, random bytes,
        # a full disk), and a file this user could read but not write opened read-only
        # without a word: the coordinator logged in, stored and acked nothing.
        if why := make_dir(self.path.parent):
            raise StoreError(f"{where(self.path)}: its directory {self.path.parent} {why}")
        if self.path.is_dir():
            raise StoreError(f"{where(self.path)} is a directory, not a database file")
        check_wal(self.path)  # after an unclean stop: read-only, before a checkpoint can
        db = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if fsync == 'full' else 'NORMAL'}")
            self.db = db
            self._migrate()
            # Reads have a connection of their own: WAL lets it read the last commit beside
            # a writer. On the writer's one, every API read and /metrics hung for as long
            # as a commit did (a disk that stopped answering writes: fsfreeze in the attack
            # run), the read waiting for the ingest thread's lock.
            self._rdb = sqlite3.connect(self.path, isolation_level=None,
                                        check_same_thread=False, timeout=30)
            self._rdb.execute("PRAGMA query_only = 1")
            self._rlock = threading.Lock()
        except (sqlite3.Error, StoreError) as e:
            if db is not None:
                db.close()
            if isinstance(e, StoreError):
                raise
            raise sqlite_open_refusal(self.path, e) from None

    def _migrate(self) -> None:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("CREATE TABLE IF NOT EXISTS schema_version "
                                "(version INTEGER NOT NULL)")
                row = self.db.execute("SELECT MAX(version) FROM schema_version").fetchone()
                have = row[0] or 0
                if have > SQLITE_SCHEMA:
                    raise StoreRefused(newer_schema(where(self.path), have, SQLITE_SCHEMA))
                # a write, which a file opened read-only refuses (SQLite opens a file it
                # may not write read-only, silently; nothing else here writes to a store
                # that needs no migration)
                self.db.execute("DELETE FROM schema_version WHERE 0")
                for version, script in SQLITE_MIGRATIONS:
                    if have >= version:
                        continue
                    for stmt in _split(script):
                        self.db.execute(stmt)
                    if version == 1:  # stores made before the verified-ack change
                        cols = [r[1] for r in self.db.execute("PRAGMA table_info(streams)")]
                        if "lo" not in cols:
                            self.db.execute("ALTER TABLE streams ADD COLUMN lo INTEGER NOT "
                                            "NULL DEFAULT 0")
                    self.db.execute("INSERT INTO schema_version VALUES (?)", (version,))
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # not after a COMMIT SQLite rolled back itself
                    self.db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction (exclusive across processes sharing the file)."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                # a COMMIT that met a full disk was rolled back by SQLite itself: a second
                # ROLLBACK raised "no transaction is active" and hid the real error
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A connection for reads (query_only), not waiting for a write transaction."""
        with self._rlock:
            yield self._rdb

    def sql(self, text: str) -> str:
        return text

    def lock_devices(self, db: Any, devices: Sequence[str]) -> None:
        """Make sure each device has its `devices` row (BEGIN IMMEDIATE already excludes
        every other writer)."""
        db.executemany("INSERT INTO devices (device) VALUES (?) ON CONFLICT(device) DO NOTHING",
                       [(d,) for d in devices])

    def insert_results(self, db: Any, rows: list[tuple]) -> list[tuple]:
        """Insert result rows (device, stream, seq, boot, t, received, body); returns the
        rows that were new (duplicates of a stored key are ignored)."""
        new = []
        for row in rows:  # one statement per row: its rowcount says whether it was new
            if db.execute("INSERT INTO results VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                          row).rowcount:
                new.append(row)
        return new

    def claim_rows(self, db: Any, rows: Sequence[tuple[str, str, str, float]], window_s: float
                   ) -> set[tuple[str, str]]:
        """Store.claim's statement for each (device, what, state, t), keys distinct, in one
        transaction; returns the (device, what) this call won. In-process: a statement a row
        costs no round trip."""
        won = set()
        for device, what, state, t in rows:
            if db.execute(_CLAIM, (device, what, state, t, window_s)).rowcount == 1:
                won.add((device, what))
        return won

    def insert_rows(self, db: Any, table: str, cols: Sequence[str], types: Sequence[str],
                    rows: Sequence[tuple]) -> None:
        """Append rows to `table` (`types` are PostgreSQL's, for its one-statement form)."""
        db.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                       f"({','.join('?' * len(cols))})", rows)

    def update_views(self, db: Any, rows: Sequence[tuple[str, float, str]]) -> None:
        """Write (view JSON, updated, device) into `devices`."""
        db.executemany("UPDATE devices SET view = ?, updated = ? WHERE device = ?", rows)

    def upsert_states(self, db: Any, rows: Sequence[tuple[str, str]]) -> None:
        """Write (device, state JSON) into `states`; a device twice: its last one stays."""
        db.executemany("INSERT INTO states VALUES (?,?) ON CONFLICT(device) DO UPDATE "
                       "SET body = excluded.body", rows)

    def in_list(self, keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """(SQL, args) of `column<SQL>` matching any of the text `keys`: a parameter each."""
        return f" IN ({','.join('?' * len(keys))})", tuple(keys)

    def seqs_from(self, db: Any, items: Sequence[tuple[str, str, int]], limit: int
                  ) -> dict[tuple[str, str], list[int]]:
        """Stored seqs of each (device, stream) from `after` on, ascending, up to `limit`."""
        return {(d, s): [q for (q,) in db.execute(
            "SELECT seq FROM results WHERE device=? AND stream=? AND seq >= ? ORDER BY seq "
            "LIMIT ?", (d, s, after, limit)).fetchall()] for d, s, after in items}

    def used_bytes(self) -> int:
        """Bytes in use (pages minus free pages; the file keeps its high-water mark)."""
        with self.reader() as db:
            (pages,), (free,), (size,) = (db.execute(f"PRAGMA {p}").fetchone()
                                          for p in ("page_count", "freelist_count",
                                                    "page_size"))
        return (pages - free) * size

    def maintain(self) -> None:
        """Nothing to create ahead in SQLite."""

    def drop_partitions(self, table: str, before: float, acked_only: bool
                        ) -> dict[str, tuple[int, int]]:
        """SQLite has no partitions: retention deletes rows (see Store.prune_results)."""
        return {}

    def oldest_partition(self, table: str, acked_only: bool
                         ) -> dict[str, tuple[int, int]] | None:
        return None

    def after_prune(self) -> None:
        # The WAL keeps its high-water mark; truncate it so the files on disk shrink too.
        with self.lock:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._rlock:
            self._rdb.close()
        with self.lock:
            self.db.close()


def _split(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


# -- PostgreSQL -----------------------------------------------------------------------------

_PG_V1 = """
CREATE TABLE results (
    device TEXT NOT NULL, stream TEXT NOT NULL, seq BIGINT NOT NULL, boot TEXT NOT NULL,
    t DOUBLE PRECISION NOT NULL, received DOUBLE PRECISION NOT NULL, body TEXT NOT NULL
) PARTITION BY RANGE (received);
CREATE TABLE results_default PARTITION OF results DEFAULT;
CREATE INDEX results_key ON results (device, stream, seq);
CREATE TABLE result_keys (device TEXT NOT NULL, stream TEXT NOT NULL, seq BIGINT NOT NULL,
                          received DOUBLE PRECISION NOT NULL,
                          PRIMARY KEY (device, stream, seq));
CREATE INDEX result_keys_received ON result_keys (received);
CREATE TABLE streams (device TEXT NOT NULL, stream TEXT NOT NULL, acked BIGINT NOT NULL,
                      lo BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (device, stream));
CREATE TABLE health (device TEXT NOT NULL, t DOUBLE PRECISION NOT NULL, body TEXT NOT NULL,
                     id BIGSERIAL) PARTITION BY RANGE (t);
CREATE TABLE health_default PARTITION OF health DEFAULT;
CREATE INDEX health_device ON health (device, t);
CREATE TABLE events (device TEXT NOT NULL, t DOUBLE PRECISION NOT NULL, type TEXT NOT NULL,
                     body TEXT NOT NULL, id BIGSERIAL);
CREATE INDEX events_device ON events (device, t);
CREATE TABLE states (device TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE quarantine (t DOUBLE PRECISION NOT NULL, device TEXT NOT NULL,
                         topic TEXT NOT NULL, reason TEXT NOT NULL, size BIGINT NOT NULL,
                         id BIGSERIAL PRIMARY KEY);
CREATE TABLE quarantine_counts (device TEXT PRIMARY KEY, n BIGINT NOT NULL);
CREATE TABLE result_counts (device TEXT PRIMARY KEY, n BIGINT NOT NULL);
CREATE TABLE devices (device TEXT PRIMARY KEY, view TEXT NOT NULL DEFAULT '{}',
                      updated DOUBLE PRECISION NOT NULL DEFAULT 0)
"""

_PG_V2 = """
CREATE TABLE health_points (device TEXT NOT NULL, t DOUBLE PRECISION NOT NULL,
    temp_c DOUBLE PRECISION, passive_trip_c DOUBLE PRECISION, rung DOUBLE PRECISION,
    rungs DOUBLE PRECISION, p95_ms DOUBLE PRECISION, target_ms DOUBLE PRECISION,
    rate_hz DOUBLE PRECISION, accuracy DOUBLE PRECISION, power_w DOUBLE PRECISION,
    rung_energy_mj DOUBLE PRECISION, battery_frac DOUBLE PRECISION,
    harvest_w DOUBLE PRECISION, id BIGSERIAL);
CREATE INDEX health_points_device ON health_points (device, t);
CREATE TABLE device_groups (device TEXT PRIMARY KEY, grp TEXT NOT NULL);
CREATE TABLE desired (device TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE rollouts (id TEXT PRIMARY KEY, created DOUBLE PRECISION NOT NULL,
                       body TEXT NOT NULL)
"""

_PG_V3 = """
CREATE TABLE claims (device TEXT NOT NULL, what TEXT NOT NULL, state TEXT NOT NULL,
                     t DOUBLE PRECISION NOT NULL, PRIMARY KEY (device, what))
"""

# the bundle shelf and the alert log (as SQLite v5); IF NOT EXISTS, so renumbering at a
# merge is harmless
_PG_V4 = """
CREATE TABLE IF NOT EXISTS bundles (id TEXT PRIMARY KEY, sha256 TEXT NOT NULL,
                                    size BIGINT NOT NULL, created DOUBLE PRECISION NOT NULL,
                                    body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bundle_chunks (sha256 TEXT NOT NULL, idx INTEGER NOT NULL,
                                          data BYTEA NOT NULL, PRIMARY KEY (sha256, idx));
ALTER TABLE bundle_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE IF NOT EXISTS alert_log (t DOUBLE PRECISION NOT NULL, device TEXT NOT NULL,
                                      code TEXT NOT NULL, state TEXT NOT NULL,
                                      body TEXT NOT NULL, id BIGSERIAL);
CREATE INDEX IF NOT EXISTS alert_log_t ON alert_log (t);
CREATE TABLE IF NOT EXISTS alert_counts (state TEXT PRIMARY KEY, n BIGINT NOT NULL)
"""

# bundle uploads in progress (as SQLite v6)
_PG_V5 = """
CREATE TABLE IF NOT EXISTS bundle_uploads (id TEXT PRIMARY KEY, sha256 TEXT NOT NULL,
                                           owner TEXT NOT NULL, t DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS bundle_uploads_sha ON bundle_uploads (sha256)
"""

# fair shares and stalled streams (as SQLite v7)
_PG_V6 = f"""
CREATE TABLE IF NOT EXISTS device_usage (device TEXT PRIMARY KEY, bytes BIGINT NOT NULL);
INSERT INTO device_usage SELECT device, SUM(n) FROM (
    SELECT device, SUM({RESULT_BYTES_SQL}) AS n FROM results GROUP BY device
    UNION ALL SELECT device, SUM({HEALTH_BYTES_SQL}) FROM health GROUP BY device
    UNION ALL SELECT device, SUM({EVENT_BYTES_SQL}) FROM events GROUP BY device) u
    GROUP BY device ON CONFLICT (device) DO NOTHING;
CREATE TABLE IF NOT EXISTS stalls (device TEXT NOT NULL, stream TEXT NOT NULL,
                                   since DOUBLE PRECISION NOT NULL, acked BIGINT NOT NULL,
                                   PRIMARY KEY (device, stream))
"""

# `result_keys.received`, read by the daily partition drop only: BRIN logs nothing an insert
# (the btree 0.19x a payload), at a blurred range after retention (docs/fleet-scale.md).
_PG_V8 = """
DROP INDEX IF EXISTS result_keys_received;
CREATE INDEX result_keys_received ON result_keys USING brin (received)
"""

# (version, statements): append, never edit, once released.
PG_MIGRATIONS: list[tuple[int, str]] = [(1, _PG_V1), (2, _PG_V2), (3, _PG_V3), (4, _PG_V4),
                                        (5, _PG_V5), (6, _PG_V6),
                                        (7, POOL_USAGE.replace("{int}", "BIGINT")),
                                        (8, _PG_V8)]
PARTITIONED = {"results": "received", "health": "t"}
READ_TIMEOUT_S = 5.0  # a PostgreSQL read's wait for a pooled connection (reader())
_MIGRATION_LOCK = 0x6564676572756E  # pg_advisory_xact_lock key ("edgerun")


class PostgresDialect:
    """A psycopg 3 connection pool; each transaction takes a connection from it."""

    name = "postgresql"
    order_col = "id"
    keys_table = "result_keys"

    def __init__(self, url: str, pool_size: int = 4, days_ahead: int = 2,
                 connect_timeout_s: float = 30.0, read_timeout_s: float = READ_TIMEOUT_S):
        import psycopg
        from psycopg_pool import ConnectionPool

        self.url = url
        self.days_ahead = days_ahead
        self.read_timeout_s = read_timeout_s
        self.errors = (psycopg.Error,)
        # deadlocks are avoided by locking devices in order; retried anyway if one happens
        self.retryable = (psycopg.errors.DeadlockDetected,
                          psycopg.errors.SerializationFailure)
        self._sql_cache: dict[str, str] = {}
        # libpq's own connect_timeout (whole seconds, 2 at least) bounds each attempt: without
        # it, an attempt on a server that accepts and never answers blocks its pool worker
        # for good, and close() below waits 5 s for that worker and then leaves it hung.
        self.pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False,
                                   kwargs={"autocommit": False,
                                           "connect_timeout": max(2, math.ceil(connect_timeout_s))},
                                   name="edgerun-store")
        try:
            self.pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as e:
            self.pool.close()
            raise StoreUnreachable(f"coordinator.store: cannot connect to the PostgreSQL store "
                             f"{_redact(url)} within {connect_timeout_s:.0f} s: "
                             f"{type(e).__name__}: {e}") from None
        try:
            self._migrate()
            self.maintain()
        except BaseException:
            self.pool.close()
            raise

    def _migrate(self) -> None:
        """Apply the migrations this database lacks, in one transaction under an advisory
        lock, so coordinators starting together apply each exactly once."""
        with self.pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            have = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version"
                                ).fetchone()[0]
            if have > PG_MIGRATIONS[-1][0]:
                raise StoreRefused(newer_schema(f"coordinator.store {_redact(self.url)}", have,
                                                PG_MIGRATIONS[-1][0]))
            for version, script in PG_MIGRATIONS:
                if version > have:
                    for stmt in _split(script):
                        conn.execute(stmt)
                    conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))

    def sql(self, text: str) -> str:
        """`?` placeholders to psycopg's `%s` (a literal `%` doubled first). Text arrays
        (`?::text[]`: the JSON bodies of a batch) go in binary (`%b`): the text format
        escapes every quote of every element with a regex substitution, which was a third
        of a PostgreSQL coordinator's ingest CPU (bench/ingest_profile.py --profile)."""
        out = self._sql_cache.get(text)
        if out is None:
            out = self._sql_cache[text] = (text.replace("%", "%%")
                                           .replace("?::text[]", "%b::text[]")
                                           .replace("?", "%s"))
        return out

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.pool.connection() as conn:  # commits on success, rolls back on error
            yield _PgConn(conn, self)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        # A read waits read_timeout_s for a pooled connection, not the pool's 30 s: with the
        # server down every API request and /metrics scrape waited the 30 s before its 503
        # (PoolTimeout is an OperationalError). Writes (transaction) keep the 30 s: a batch
        # rides out a short outage, and its devices re-send if it fails anyway.
        with self.pool.connection(timeout=self.read_timeout_s) as conn:
            yield _PgConn(conn, self)

    def lock_devices(self, db: Any, devices: Sequence[str]) -> None:
        """Create missing `devices` rows and lock the batch's rows in sorted order: writes
        for one device are serialised across coordinators (its acks see every committed
        result), and ordered locking cannot deadlock."""
        devs = sorted(set(devices))
        db.execute("INSERT INTO devices (device) SELECT unnest(?::text[]) "
                   "ON CONFLICT (device) DO NOTHING", (devs,))
        db.execute("SELECT device FROM devices WHERE device = ANY(?::text[]) ORDER BY device "
                   "FOR UPDATE", (devs,))  # ::text[]: the array goes in binary (sql())

    def insert_results(self, db: Any, rows: list[tuple]) -> list[tuple]:
        if not rows:
            return []
        # Keys stored are read, the others inserted plainly (lock_devices holds the devices;
        # ON CONFLICT's speculative insertion logged a confirm record a key: 0.14x payload).
        cols = list(zip(*rows, strict=True))
        have = {(d, s, q) for d, s, q in db.execute(
            "SELECT k.device, k.stream, k.seq FROM result_keys k JOIN unnest(?::text[], "
            "?::text[], ?::bigint[]) AS u(device, stream, seq) ON k.device = u.device AND "
            "k.stream = u.stream AND k.seq = u.seq",
            (list(cols[0]), list(cols[1]), list(cols[2]))).fetchall()}
        fresh = []
        for r in rows:  # a key twice in one batch: inserted once, its first row kept
            if (r[0], r[1], r[2]) not in have:
                have.add((r[0], r[1], r[2]))
                fresh.append(r)
        if fresh:
            c = list(zip(*fresh, strict=True))
            db.execute("INSERT INTO result_keys (device, stream, seq, received) "
                       "SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[], ?::float8[])",
                       (list(c[0]), list(c[1]), list(c[2]), list(c[5])))
            db.execute("INSERT INTO results SELECT * FROM unnest(?::text[], ?::text[], "
                       "?::bigint[], ?::text[], ?::float8[], ?::float8[], ?::text[])",
                       tuple(list(x) for x in c))
        return fresh

    def claim_rows(self, db: Any, rows: Sequence[tuple[str, str, str, float]], window_s: float
                   ) -> set[tuple[str, str]]:
        """As SQLiteDialect.claim_rows in one statement: the rows inserted or updated come
        back (RETURNING leaves out those the WHERE kept), locked in (device, what) order."""
        if not rows:
            return set()
        c = list(zip(*rows, strict=True))
        return {(d, w) for d, w in db.execute(
            "INSERT INTO claims SELECT * FROM unnest(?::text[], ?::text[], ?::text[], "
            "?::float8[]) AS u(device, what, state, t) ORDER BY device, what "
            "ON CONFLICT (device, what) DO UPDATE SET state = excluded.state, t = excluded.t "
            "WHERE claims.state <> excluded.state OR claims.t < excluded.t - ? "
            "RETURNING device, what",
            (list(c[0]), list(c[1]), list(c[2]), list(c[3]), window_s)).fetchall()}

    def insert_rows(self, db: Any, table: str, cols: Sequence[str], types: Sequence[str],
                    rows: Sequence[tuple]) -> None:
        """One INSERT ... SELECT FROM unnest(arrays) (executemany costs a statement a row)."""
        if rows:
            arrays = ", ".join(f"?::{t}[]" for t in types)
            db.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT * FROM unnest({arrays})",
                       tuple(list(c) for c in zip(*rows, strict=True)))

    def update_views(self, db: Any, rows: Sequence[tuple[str, float, str]]) -> None:
        if rows:
            c = list(zip(*rows, strict=True))
            db.execute("UPDATE devices d SET view = u.view, updated = u.updated FROM "
                       "unnest(?::text[], ?::float8[], ?::text[]) AS u(view, updated, device) "
                       "WHERE d.device = u.device", (list(c[0]), list(c[1]), list(c[2])))

    def upsert_states(self, db: Any, rows: Sequence[tuple[str, str]]) -> None:
        """As SQLiteDialect.upsert_states in one statement (executemany is a statement a
        row: 10,000 births spent about a third of their store time there, by cProfile). ON
        CONFLICT cannot touch a row twice in one statement: a device's last state only."""
        if rows:
            last = dict(rows)
            db.execute("INSERT INTO states SELECT * FROM unnest(?::text[], ?::text[]) "
                       "ON CONFLICT (device) DO UPDATE SET body = excluded.body",
                       (list(last), list(last.values())))

    def in_list(self, keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """As SQLiteDialect.in_list with one text array parameter: psycopg re-parses a
        query of more than 50 parameters on every call and dumps each parameter alone."""
        return " = ANY(?::text[])", (list(keys),)

    def seqs_from(self, db: Any, items: Sequence[tuple[str, str, int]], limit: int
                  ) -> dict[tuple[str, str], list[int]]:
        """As SQLiteDialect.seqs_from, for every stream in one round trip."""
        out: dict[tuple[str, str], list[int]] = {(d, s): [] for d, s, _ in items}
        if items:
            cols = list(zip(*items, strict=True))
            for d, s, q in db.execute(
                    "SELECT q.device, q.stream, k.seq FROM unnest(?::text[], ?::text[], "
                    "?::bigint[]) AS q(device, stream, after) CROSS JOIN LATERAL (SELECT seq "
                    "FROM result_keys k WHERE k.device = q.device AND k.stream = q.stream AND "
                    "k.seq >= q.after ORDER BY k.seq LIMIT ?) k",
                    (list(cols[0]), list(cols[1]), list(cols[2]), limit)).fetchall():
                out[(d, s)].append(q)
            for v in out.values():
                v.sort()
        return out

    def used_bytes(self) -> int:
        """Bytes of this schema's tables with their indexes and TOAST."""
        with self.reader() as db:
            return int(db.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind = 'r'").fetchone()[0])

    # -- partitions --------------------------------------------------------------------------

    def maintain(self, now: float | None = None) -> None:
        """Create the daily partitions from yesterday to `days_ahead` days ahead (idempotent;
        run at start and by each retention pass)."""
        now = dt.datetime.now(dt.UTC).timestamp() if now is None else now
        day0 = int(now // DAY) - 1
        with self.pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            for table in PARTITIONED:
                for d in range(day0, day0 + self.days_ahead + 2):
                    name = f"{table}_p{_day_name(d)}"
                    try:
                        with conn.transaction():
                            conn.execute(f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF "
                                         f"{table} FOR VALUES FROM ({d * DAY}) TO "
                                         f"({(d + 1) * DAY})")
                    except self.errors:
                        self._attach_moving(conn, table, name, d)

    def _attach_moving(self, conn: Any, table: str, name: str, day: int) -> None:
        """Make day `day`'s partition of `table` when the default partition already holds
        rows of that day (CREATE ... PARTITION OF is then refused): a partition made late,
        or health a device claimed days ahead (an unsynced claim may read up to 2100; one
        such health a day stopped every day's partition, the fleet's health then deleted
        by row, never dropped). The rows are moved out of the default, in one savepoint."""
        lo, hi, col = day * DAY, (day + 1) * DAY, PARTITIONED[table]
        try:
            with conn.transaction():
                conn.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)")
                conn.execute(f"WITH moved AS (DELETE FROM {table}_default WHERE {col} >= %s "
                             f"AND {col} < %s RETURNING *) INSERT INTO {name} "
                             "SELECT * FROM moved", (lo, hi))
                conn.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES "
                             f"FROM ({lo}) TO ({hi})")
        except self.errors as e:  # the day's rows stay in the default (deleted by row)
            log.warning("coordinator.store: could not make the partition %s: %s", name, e)

    def _partitions(self, db: Any, table: str) -> list[tuple[str, float]]:
        """(name, end of range) of the day partitions of `table`, oldest first."""
        names = [n for (n,) in db.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = ?", (table,))]
        out = []
        for n in names:
            if n.startswith(f"{table}_p"):
                day = dt.datetime.strptime(n.rsplit("_p", 1)[1], "%Y%m%d").replace(
                    tzinfo=dt.UTC)
                out.append((n, day.timestamp() + DAY))
        return sorted(out, key=lambda x: x[1])

    def _drop(self, db: Any, table: str, name: str, end: float, acked_only: bool
              ) -> dict[str, tuple[int, int]] | None:
        """Drop one partition; for results only when every row in it is at or below its
        stream's ack (else None). Returns the (rows, logical bytes) it held per device."""
        # coordinators sharing the store run retention at the same times: one drops at a
        # time, and a partition another one dropped since the list was read is skipped
        db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        if db.execute("SELECT to_regclass(?)", (name,)).fetchone()[0] is None:
            return None
        if acked_only and db.execute(
                f"SELECT 1 FROM {name} r LEFT JOIN streams s ON s.device = r.device AND "
                "s.stream = r.stream WHERE s.acked IS NULL OR r.seq > s.acked LIMIT 1"
                ).fetchone():
            return None
        size = RESULT_BYTES_SQL if table == "results" else HEALTH_BYTES_SQL
        per_device = {d: (int(n), int(b)) for d, n, b in db.execute(
            f"SELECT device, COUNT(*), SUM({size}) FROM {name} GROUP BY device").fetchall()}
        db.execute(f"DROP TABLE {name}")
        if table == "results":
            db.execute("DELETE FROM result_keys WHERE received < ? AND received >= ?",
                       (end, end - DAY))
        elif table == "health":  # the timeline goes with the health it was copied from
            db.execute("DELETE FROM health_points WHERE t < ? AND t >= ?", (end, end - DAY))
        return per_device

    def drop_partitions(self, table: str, before: float, acked_only: bool
                        ) -> dict[str, tuple[int, int]]:
        """Drop every day partition of `table` that ends at or before `before`; returns
        (rows, logical bytes) dropped per device."""
        out: dict[str, tuple[int, int]] = {}
        with self.reader() as db:
            parts = self._partitions(db, table)
        for name, end in parts:
            if end > before:
                break
            with self.transaction() as db:
                got = self._drop(db, table, name, end, acked_only)
            for k, (n, b) in (got or {}).items():
                n0, b0 = out.get(k, (0, 0))
                out[k] = (n0 + n, b0 + b)
        return out

    def oldest_partition(self, table: str, acked_only: bool
                         ) -> dict[str, tuple[int, int]] | None:
        """Drop the oldest droppable day partition that is not today's (size retention);
        returns (rows, logical bytes) it held per device, or None when there is none."""
        today = (dt.datetime.now(dt.UTC).timestamp() // DAY) * DAY
        with self.reader() as db:
            parts = [p for p in self._partitions(db, table) if p[1] <= today]
        for name, end in parts:
            with self.transaction() as db:
                got = self._drop(db, table, name, end, acked_only)
            if got is not None:
                return got
        return None

    def after_prune(self) -> None:
        """Row deletes leave space for autovacuum to reuse; dropped partitions are gone."""

    def close(self) -> None:
        self.pool.close()


def _redact(url: str) -> str:
    """The URL without its password, for logs."""
    head, sep, tail = url.partition("@")
    if sep and ":" in head.split("//", 1)[-1]:
        scheme, _, user = head.partition("//")
        return f"{scheme}//{user.split(':', 1)[0]}:***@{tail}"
    return url


def _day_name(day: int) -> str:
    return dt.datetime.fromtimestamp(day * DAY, dt.UTC).strftime("%Y%m%d")


class _PgConn:
    """A psycopg connection that takes the store's portable `?` SQL."""

    def __init__(self, conn: Any, dialect: PostgresDialect):
        self.conn, self.d = conn, dialect

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.d.sql(sql), tuple(args))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        cur = self.conn.cursor()
        cur.executemany(self.d.sql(sql), rows)
        return cur


def is_url(store: str) -> bool:
    """Whether a `coordinator.store` value names a PostgreSQL server rather than a file."""
    return store.startswith(("postgresql://", "postgres://"))


def open_dialect(store: str | Path, fsync: str = "normal", read_timeout_s: float = READ_TIMEOUT_S
                 ) -> SQLiteDialect | PostgresDialect:
    """The dialect for a store setting: a postgresql:// URL, else an SQLite path.
    `read_timeout_s`: how long a PostgreSQL read waits for a pooled connection."""
    if isinstance(store, str) and is_url(store):
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError:
            raise RuntimeError("coordinator.store is a PostgreSQL URL but psycopg is not "
                               "installed: pip install 'edgerun[postgres]'") from None
        return PostgresDialect(store, read_timeout_s=read_timeout_s)
    return SQLiteDialect(store, fsync)
