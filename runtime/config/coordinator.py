"""The `[coordinator]` section, with the checks it needs: a webhook URL, the alert codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

from runtime.config.telemetry import BrokerConfig, check_name

# Every code the coordinator's alerts can raise (runtime/coordinator/fleet.py `alerts`;
# coordinator.webhook_alerts is checked against it).
ALERT_CODES = ("governor_disabled", "offline", "stale", "throttled", "hot", "sensor",
               "failsafe", "slo", "backlog", "evicted", "version", "missed_wake",
               # the coordinator's own: its store stalled or failing (store_watch.py)
               "store")


def check_url(url: str) -> str | None:
    """Why `url` cannot be a webhook target, or None when it is an http(s) URL with a host."""
    parts = urlparse(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        return f"has a bad port: {url[:80]!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL with a host, got {redacted_url(url)[:80]!r}"
    return None


def redacted_url(url: str) -> str:
    """The URL without credentials or query (either may hold a token) for logs and stats."""
    p = urlparse(url)
    host = p.hostname or ""
    port = f":{p.port}" if p.port else ""
    return f"{p.scheme}://{host}{port}{p.path}"


@dataclass(frozen=True)
class CoordinatorConfig:
    """Where the coordinator listens, stores and which key it signs commands with."""

    fleet: str = "default"
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    client_id: str = "edgerun-coordinator"  # fixed: the broker keeps its session while it is down
    session_expiry_s: int = 7 * 24 * 3600  # MQTT 5: how long the broker queues for it
    share_group: str = ""  # non-empty: $share/<group>/... so several coordinators split the load
    # An SQLite file, or a PostgreSQL URL (postgresql://user@host/db; pip install
    # 'edgerun[postgres]') that coordinators on several hosts share (docs/fleet-scale.md).
    store: str = "~/.local/state/edgerun/coordinator.db"
    fsync: Literal["full", "normal"] = "normal"
    signing_key: str = ""  # Ed25519 private key (PEM) for `fleet send`; empty = cannot command
    # Directory of `<device>.pub` (Ed25519, PEM or raw): a command reply counts only when it is
    # signed by its device's key; empty = no reply can be verified (commands report unverified).
    device_keys: str = ""
    future_skew_s: float = 300.0  # state/health stamped further ahead than this is refused
    http_host: str = "127.0.0.1"
    http_port: int = 8787  # 0 = pick a free port (tests)
    api_token_file: str = ""  # empty = `api-token` next to the store; made 0600 at first start
    http_timeout_s: float = 10.0  # an idle or slow HTTP connection is closed after this
    retention_days: float = 90.0  # results older than this are pruned (0 = keep by age)
    max_store_mb: float = 2048.0  # past this the oldest results are pruned (0 = no cap)
    retention_interval_s: float = 600.0  # how often retention runs
    # Fair shares (docs/fleet-scale.md, "Fair shares"): max_store_mb is shared equally by the
    # devices holding data; a device past its share may borrow while the store holds less
    # than the cap plus store_margin of it, then its messages are refused until retention
    # (woken at most every retention_wake_s) has taken back what it borrowed.
    store_margin: float = 0.25
    retention_wake_s: float = 5.0
    # a stream whose ack has not moved for this long since its floor was first not stored
    # has its rows above the ack deleted (the device still holds them), with an event
    floor_wait_s: float = 900.0
    stale_after_s: float = 30.0
    offline_after_s: float = 120.0
    wake_margin_s: float = 300.0  # a sleeper this late past its announced wake: missed_wake
    backlog_alert: int = 1000
    slo_alert: float = 0.95
    keep_health_s: float = 7 * 24 * 3600
    keep_events_s: float = 30 * 24 * 3600
    # Alert transitions POSTed as JSON (runtime/coordinator/webhooks.py); empty url = off.
    webhook_url: str = ""
    webhook_secret_file: str = ""  # HMAC-SHA256 key for X-Edgerun-Signature (mode 0600)
    webhook_timeout_s: float = 5.0  # per POST
    webhook_attempts: int = 8  # tries per alert (connection errors, 408, 429, 5xx)
    webhook_backoff_s: float = 1.0  # first retry delay, doubled per retry up to 60 s
    webhook_queue: int = 1000  # alerts waiting; past this the oldest is dropped and counted
    webhook_alerts: tuple[str, ...] = ()  # alert codes sent (docs/dashboard.md); empty = all
    alert_clear_s: float = 30.0  # an alert is reported cleared once away this long
    # `offline` is reported raised only once it has lasted this long: a broker's restart
    # publishes every connected device's will (mosquitto 2) and a service restart says
    # offline, each back in seconds; 0: at once (alerts.py)
    offline_alert_s: float = 60.0
    ingest_batch: int = 500  # messages per store transaction
    # A batch waits up to this long for more messages before its transaction: every
    # transaction writes whole pages (WAL and checkpoint), so one result a transaction wrote
    # ~26 KB for ~280 bytes (docs/telemetry.md, "Disk writes"); acks come this much later,
    # and a device waits for them past `inflight` unacked results (a fixed 1 s window halved
    # what a 100/s device got stored, measured), so the window ends early once one device
    # has `ingest_window_results` results in it (keep it well under the fleet's smallest
    # `[telemetry] inflight`, 200 by default), and at once for births and command replies.
    # Used up to an eighth of stale_after_s (a device's messages reach the fleet view only
    # at the window's end: a window as long as stale_after_s called a live device stale).
    # 0: at once.
    ingest_window_s: float = 2.0
    ingest_window_results: int = 25
    # Bounded work per message (docs/fleet-scale.md, "Bounded work per message"): a device's
    # healths stamped within one coalesce_s of its clock, and its identical events, arriving
    # within coalesce_s are one (the latest wins, stored at the window's end; a burst of its
    # history, one health a window, is all kept); a returning device is re-sent its desired
    # state once per boot and at most once per resend_window_s (births in between: the
    # latest is answered at its end);
    # at most max_pending_replies command replies are awaited at once.
    coalesce_s: float = 1.0
    resend_window_s: float = 60.0
    max_pending_replies: int = 10_000
    ingest_delay_s: float = 0.0  # artificial slowness per batch, for fault tests only
    # A store batch in flight longer than this is a stall: logged (ERROR, at most once a
    # minute, and when it ends), the `store` alert raised, devices whose messages wait in
    # the inbox not aged stale meanwhile (runtime/coordinator/store_watch.py)
    store_stall_s: float = 5.0
    # A PostgreSQL read (API, dashboard, /metrics) waits this long for a pooled connection,
    # then the API answers 503 "store unavailable"; writes wait the pool's 30 s
    store_read_timeout_s: float = 5.0
    # Model bundles (docs/ota.md): kept in the store; bundles_dir is only the directory an
    # older coordinator kept them in, imported once at start (empty: `bundles/` next to an
    # SQLite store); their size cap, and the API address devices download from (empty:
    # http://http_host:http_port; set it when devices reach the API by another name).
    bundles_dir: str = ""
    max_bundle_mb: float = 512.0
    public_url: str = ""
    rollout_timeout_s: float = 3600.0  # a device without a probation verdict this long after
    # its deploy counts as failed (a silent canary halts the rollout)
    # The broker directory (`edgerun fleet enroll --broker-dir`) when the coordinator runs
    # beside the broker: its ACL is regenerated at start if an older version wrote it (it
    # would lack topics added since: bundles over MQTT). Empty: not done here.
    broker_dir: str = ""

    def validate(self) -> tuple[str, str] | None:
        if why := check_name("fleet", self.fleet):
            return "fleet", why
        if self.share_group and (why := check_name("share_group", self.share_group)):
            return "share_group", why
        if not 0 <= self.http_port < 65536:
            return "http_port", f"must be 0..65535, got {self.http_port}"
        if not 0.1 <= self.http_timeout_s <= 3600:
            return "http_timeout_s", f"must be 0.1..3600, got {self.http_timeout_s}"
        for key in ("retention_days", "max_store_mb"):  # each by name: it locates the line
            if getattr(self, key) < 0:
                return key, f"must be >= 0 (0 = off), got {getattr(self, key)}"
        if self.retention_interval_s < 1:
            return "retention_interval_s", f"must be >= 1, got {self.retention_interval_s}"
        if not 0 <= self.store_margin <= 10:
            return "store_margin", f"must be 0..10, got {self.store_margin}"
        if not 0.1 <= self.retention_wake_s <= 86400:
            return "retention_wake_s", f"must be 0.1..86400, got {self.retention_wake_s}"
        if not 0 <= self.ingest_window_s <= 10:
            return "ingest_window_s", f"must be 0..10 s, got {self.ingest_window_s}"
        if self.ingest_window_results < 0:
            return "ingest_window_results", \
                f"must be >= 0 (0: no early end), got {self.ingest_window_results}"
        if not (0 <= self.coalesce_s <= 3600 and 0 <= self.resend_window_s <= 86400):
            return "coalesce_s", "coalesce_s must be 0..3600 and resend_window_s 0..86400"
        if not 0.1 <= self.store_stall_s <= 3600:
            return "store_stall_s", f"must be 0.1..3600 s, got {self.store_stall_s}"
        if not 0.1 <= self.store_read_timeout_s <= 300:
            return "store_read_timeout_s", \
                f"must be 0.1..300 s, got {self.store_read_timeout_s}"
        if not 1 <= self.max_pending_replies <= 10**6:
            return "max_pending_replies", f"must be 1..1e6, got {self.max_pending_replies}"
        if not 1 <= self.floor_wait_s <= 30 * 86400:
            return "floor_wait_s", f"must be 1..2592000 s, got {self.floor_wait_s}"
        if self.webhook_url and (why := check_url(self.webhook_url)):
            return "webhook_url", why
        if unknown := sorted(set(self.webhook_alerts) - set(ALERT_CODES)):
            return "webhook_alerts", f"unknown alert code(s) {unknown}; known: {ALERT_CODES}"
        for key in ("alert_clear_s", "offline_alert_s"):
            if not 0 <= (v := getattr(self, key)) <= 86400:
                return key, f"must be 0..86400, got {v}"
        if not (0.1 <= self.webhook_timeout_s <= 300 and 1 <= self.webhook_attempts <= 100
                and 0 <= self.webhook_backoff_s <= 3600 and 1 <= self.webhook_queue <= 10**6):
            return "webhook_url", ("webhook_timeout_s must be 0.1..300, webhook_attempts "
                                   "1..100, webhook_backoff_s 0..3600, webhook_queue 1..1e6")
        # pruning deletes what is older than now - keep: 0 or less deleted every health
        # message and event the store held, at start and every hour after
        for key in ("keep_health_s", "keep_events_s"):
            if getattr(self, key) < 60:
                return key, f"must be >= 60 s, got {getattr(self, key)}"
        if self.future_skew_s < 0:
            return "future_skew_s", f"must be >= 0, got {self.future_skew_s}"
        if self.stale_after_s <= 0:
            return "stale_after_s", f"must be > 0, got {self.stale_after_s}"
        if self.offline_after_s < self.stale_after_s:
            return "offline_after_s", "must be >= stale_after_s"
        return None
