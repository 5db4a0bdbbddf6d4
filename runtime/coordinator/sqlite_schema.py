"""The SQLite store's schema, version by version: the migrations SQLiteDialect._migrate
(dialect.py) applies in order, each recorded in `schema_version`; and the pool usage table's,
which PostgreSQL's migrations share (with BIGINT)."""

from __future__ import annotations

from runtime.coordinator.quotas import EVENT_BYTES_SQL, HEALTH_BYTES_SQL, RESULT_BYTES_SQL

_V1 = """
CREATE TABLE IF NOT EXISTS results (
    device TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, boot TEXT NOT NULL,
    t REAL NOT NULL, received REAL NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (device, stream, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    device TEXT NOT NULL, stream TEXT NOT NULL, acked INTEGER NOT NULL,
    lo INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (device, stream)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS health (device TEXT NOT NULL, t REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS health_device ON health (device, t);
CREATE TABLE IF NOT EXISTS events (device TEXT NOT NULL, t REAL NOT NULL, type TEXT NOT NULL,
                                   body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_device ON events (device, t);
CREATE TABLE IF NOT EXISTS states (device TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine (t REAL NOT NULL, device TEXT NOT NULL,
                                       topic TEXT NOT NULL, reason TEXT NOT NULL,
                                       size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine_counts (device TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""

# v2: the fleet views kept in tables (every coordinator answers the same) and the per-device
# result counts maintained by ingest and retention (no GROUP BY over all results).
_V2 = """
CREATE TABLE IF NOT EXISTS result_counts (device TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO result_counts SELECT device, COUNT(*) FROM results GROUP BY device
    ON CONFLICT(device) DO NOTHING;
CREATE TABLE IF NOT EXISTS devices (device TEXT PRIMARY KEY, view TEXT NOT NULL DEFAULT '{}',
                                    updated REAL NOT NULL DEFAULT 0);
"""

# v3: the dashboard's timeline, numbers copied from each health at ingest (store.TIMELINE);
# OTA rollouts: device groups, desired state, rollouts (runtime/coordinator/rollout.py)
_V3 = """
CREATE TABLE IF NOT EXISTS health_points (device TEXT NOT NULL, t REAL NOT NULL,
    temp_c REAL, passive_trip_c REAL, rung REAL, rungs REAL, p95_ms REAL, target_ms REAL,
    rate_hz REAL, accuracy REAL, power_w REAL, rung_energy_mj REAL, battery_frac REAL,
    harvest_w REAL);
CREATE INDEX IF NOT EXISTS health_points_device ON health_points (device, t);
CREATE TABLE IF NOT EXISTS device_groups (device TEXT PRIMARY KEY, grp TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS desired (device TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (id TEXT PRIMARY KEY, created REAL NOT NULL,
                                     body TEXT NOT NULL);
"""

# v4: what one of several coordinators on one store does once (Store.claim: alert
# transitions to the webhook, the re-sends to a returning device)
_V4 = """
CREATE TABLE IF NOT EXISTS claims (device TEXT NOT NULL, what TEXT NOT NULL,
                                   state TEXT NOT NULL, t REAL NOT NULL,
                                   PRIMARY KEY (device, what));
"""

# v5: the bundle shelf shared by every coordinator on the store (runtime/coordinator/bundles.py):
# each bundle's row, and its bytes as rows of at most 1 MiB keyed by (sha256, index); the
# dashboard's alert transitions and their counts (runtime/coordinator/alert_log.py)
_V5 = """
CREATE TABLE IF NOT EXISTS bundles (id TEXT PRIMARY KEY, sha256 TEXT NOT NULL,
                                    size INTEGER NOT NULL, created REAL NOT NULL,
                                    body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bundle_chunks (sha256 TEXT NOT NULL, idx INTEGER NOT NULL,
                                          data BLOB NOT NULL, PRIMARY KEY (sha256, idx));
CREATE TABLE IF NOT EXISTS alert_log (t REAL NOT NULL, device TEXT NOT NULL,
                                      code TEXT NOT NULL, state TEXT NOT NULL,
                                      body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS alert_log_t ON alert_log (t);
CREATE TABLE IF NOT EXISTS alert_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""

# v6: bundle uploads in progress (runtime/coordinator/bundles.py): chunk rows are written
# before their bundle's row; this row (refreshed with each chunk) tells them from the rows of
# an upload that died, which the shelf's sweep removes
_V6 = """
CREATE TABLE IF NOT EXISTS bundle_uploads (id TEXT PRIMARY KEY, sha256 TEXT NOT NULL,
                                           owner TEXT NOT NULL, t REAL NOT NULL);
CREATE INDEX IF NOT EXISTS bundle_uploads_sha ON bundle_uploads (sha256);
"""

# v7: fair shares of the store (runtime/coordinator/quotas.py): the logical bytes each device
# holds, maintained by ingest and every delete; streams whose ack stopped (`stalls`: since
# when, at which ack), quarantined by retention after coordinator.floor_wait_s
_V7 = f"""
CREATE TABLE IF NOT EXISTS device_usage (device TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
INSERT INTO device_usage SELECT device, SUM(n) FROM (
    SELECT device, SUM({RESULT_BYTES_SQL}) AS n FROM results GROUP BY device
    UNION ALL SELECT device, SUM({HEALTH_BYTES_SQL}) FROM health GROUP BY device
    UNION ALL SELECT device, SUM({EVENT_BYTES_SQL}) FROM events GROUP BY device) u
    GROUP BY device ON CONFLICT(device) DO NOTHING;
CREATE TABLE IF NOT EXISTS stalls (device TEXT NOT NULL, stream TEXT NOT NULL,
                                   since REAL NOT NULL, acked INTEGER NOT NULL,
                                   PRIMARY KEY (device, stream));
"""


# v8: a pool per device and kind of row (results, health and events each with their
# quota, runtime/coordinator/quotas.py); device_usage, one total per device, is replaced
POOL_USAGE = f"""
CREATE TABLE IF NOT EXISTS pool_usage (device TEXT NOT NULL, pool TEXT NOT NULL,
                                       bytes {{int}} NOT NULL, PRIMARY KEY (device, pool));
INSERT INTO pool_usage SELECT device, pool, n FROM (
    SELECT device, 'results' AS pool, SUM({RESULT_BYTES_SQL}) AS n FROM results GROUP BY device
    UNION ALL SELECT device, 'health', SUM({HEALTH_BYTES_SQL}) FROM health GROUP BY device
    UNION ALL SELECT device, 'events', SUM({EVENT_BYTES_SQL}) FROM events GROUP BY device) u
    WHERE n > 0 ON CONFLICT (device, pool) DO NOTHING;
DROP TABLE IF EXISTS device_usage
"""
_V8 = POOL_USAGE.replace("{int}", "INTEGER")
# (version, statements): append, never edit, once released.
SQLITE_MIGRATIONS: list[tuple[int, str]] = [(1, _V1), (2, _V2), (3, _V3), (4, _V4), (5, _V5),
                                            (6, _V6), (7, _V7), (8, _V8)]
SQLITE_SCHEMA = SQLITE_MIGRATIONS[-1][0]  # the newest version _migrate knows
