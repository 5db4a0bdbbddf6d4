"""The coordinator's Prometheus exposition (`GET /metrics` on the API, same bearer token).

A custom collector reads the fleet view and stats at scrape time, so nothing is counted per
message and a scrape always shows the current view: per-device gauges from each device's
latest health (wire/metrics.py; left out while the device is offline or asleep, so a dead box
does not show its last temperature as current), its status, alerts, stored results and quarantined
messages, and fleet-wide figures. Device values are hostile: one that is missing or odd is
skipped; a device whose view cannot be read at all is left out of this scrape and logged.
While the store cannot be read (a server down) a scrape carries the coordinator's own figures
alone, its store's state among them, rather than failing: that gauge is there for then.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runtime.coordinator import coord_stats
from runtime.coordinator.service import INBOUND, Coordinator
from runtime.coordinator.store_open import unavailable
from runtime.wire import metrics
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.metrics")

CONTENT_TYPE = metrics.CONTENT_TYPE

STATUSES = ("online", "stale", "offline", "asleep")
# Coordinator counters exposed by name (service.Coordinator.counters); others stay in stats.
_ERRORS = ("ingest_errors", "housekeeping_errors", "retention_errors", "receive_errors",
           "inbox_full_dropped")


class FleetCollector:
    """Collects the fleet's metrics from a Coordinator at scrape time."""

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator
        self._rlog = RateLimitedLog(log)

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry must not run a scrape when the collector is added."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, from the fleet view and stats read now; while the store cannot be
        read, the coordinator's own alone (its store's state among them), never a 503."""
        try:
            views = self.coordinator.fleet_view()
            stats = self.coordinator.stats()
        except Exception as e:
            if not unavailable(e):
                raise
            self._rlog.log("store", "/metrics: the store cannot be read (%s): the "
                           "coordinator's own figures only, none of its devices'", e,
                           level=logging.ERROR)
            yield from _own(coord_stats.own(self.coordinator))
            return
        rows: list[tuple[dict[str, str], Any]] = []
        status = GaugeMetricFamily("edgerun_device_online",
                                   "1 when the device is online (0: stale or offline)",
                                   labels=["device"])
        status_each = GaugeMetricFamily("edgerun_device_status",
                                        "1 for the device's current status", labels=["device",
                                                                                     "status"])
        last_seen = GaugeMetricFamily("edgerun_device_last_seen_timestamp_seconds",
                                      "Coordinator clock when the device was last heard",
                                      labels=["device"])
        alert = GaugeMetricFamily("edgerun_device_alert",
                                  "1 for each alert active on the device", labels=["device",
                                                                                  "alert"])
        stored = GaugeMetricFamily("edgerun_device_results_stored",
                                   "Results from the device held in the coordinator's store",
                                   labels=["device"])
        quarantined = GaugeMetricFamily("edgerun_device_quarantined_messages",
                                        "Messages from the device in the quarantine table",
                                        labels=["device"])
        info = GaugeMetricFamily("edgerun_device_info", "Model, running variant and edgerun "
                                 "version of the device (always 1)",
                                 labels=["device", "model", "choice", "version"])
        by_status: Counter = Counter()
        by_alert: Counter = Counter()
        for v in views:
            try:
                device = str(v["device"])
                st = str(v.get("status", ""))
                codes = sorted({str(a[0]) for a in v.get("alerts") or ()})
                versions = v.get("versions")
                version = versions.get("edgerun", "") if isinstance(versions, Mapping) else ""
                row_health = v.get("health")
                seen = float(v.get("last_seen") or 0.0)
                n_stored, n_quarantined = int(v.get("results_stored", 0)), int(
                    v.get("quarantined", 0))
            except Exception as e:  # one device's view must not cost the others
                self._rlog.log("view", "left a device out of /metrics: its view is not "
                               "readable (%s: %s)", type(e).__name__, e)
                continue
            by_status[st] += 1
            by_alert.update(codes)
            status.add_metric([device], 1.0 if st == "online" else 0.0)
            for s in STATUSES:
                status_each.add_metric([device, s], 1.0 if st == s else 0.0)
            if seen > 0:
                last_seen.add_metric([device], seen)
            for code in codes:
                alert.add_metric([device, code], 1.0)
            stored.add_metric([device], n_stored)
            quarantined.add_metric([device], n_quarantined)
            info.add_metric([device, str(v.get("model", "")), str(v.get("choice", "")),
                             str(version)], 1.0)
            if st not in ("offline", "asleep"):  # its last health is history, not a reading
                rows.append(({"device": device}, row_health))
        yield from (status, status_each, last_seen, alert, stored, quarantined, info)
        yield from metrics.families(rows, ("device",))
        yield from self._fleet(views, stats, by_status, by_alert)

    def _fleet(self, views: list[dict[str, Any]], stats: dict[str, Any], by_status: Counter,
               by_alert: Counter) -> Iterator[Metric]:
        devices = GaugeMetricFamily("edgerun_fleet_devices", "Devices by status",
                                    labels=["status"])
        for s in STATUSES:
            devices.add_metric([s], by_status.get(s, 0))
        yield devices
        alerts = GaugeMetricFamily("edgerun_fleet_alerts_active",
                                   "Devices with each alert active", labels=["alert"])
        for code, n in sorted(by_alert.items()):
            alerts.add_metric([code], n)
        yield alerts
        yield GaugeMetricFamily("edgerun_fleet_results_stored",
                                "Results held in the coordinator's store",
                                value=sum(int(v.get("results_stored", 0)) for v in views))
        q = stats.get("quarantined") or {}
        yield GaugeMetricFamily("edgerun_fleet_quarantined_messages",
                                "Rows in the store's quarantine table (refused messages)",
                                value=int(q.get("total", 0)))
        yield from _own(stats)


def _own(stats: Mapping[str, Any]) -> Iterator[Metric]:
    """The coordinator's own families (coord_stats.own: none read from the store), and the
    store's usage where `stats` has it."""
    counters = stats.get("counters") or {}
    msgs = CounterMetricFamily("edgerun_coordinator_messages_total",
                               "Messages admitted since the coordinator started, by kind",
                               labels=["kind"])
    for kind in INBOUND:
        msgs.add_metric([kind], counters.get(kind, 0))
    yield msgs
    yield CounterMetricFamily("edgerun_coordinator_quarantined_total",
                              "Messages quarantined since the coordinator started",
                              value=counters.get("quarantined", 0))
    errors = CounterMetricFamily("edgerun_coordinator_errors_total",
                                 "Failures the coordinator survived, by kind",
                                 labels=["kind"])
    for kind in _ERRORS:
        errors.add_metric([kind], counters.get(kind, 0))
    yield errors
    yield GaugeMetricFamily("edgerun_coordinator_connected",
                            "1 when the coordinator is subscribed on the broker",
                            value=1.0 if stats.get("connected") else 0.0)
    store = stats.get("store") or {}
    state = GaugeMetricFamily("edgerun_coordinator_store_state",
                              "1 for the store's state now: ok, stalled (a batch in "
                              "flight past store_stall_s) or failing (the last batch "
                              "failed)", labels=["state"])
    for name in ("ok", "stalled", "failing"):
        state.add_metric([name], 1.0 if store.get("state") == name else 0.0)
    yield state
    yield GaugeMetricFamily("edgerun_coordinator_store_batch_in_flight_seconds",
                            "How long the store batch in flight has been waiting "
                            "(0: none in flight)", value=float(store.get("in_flight_s") or 0))
    yield GaugeMetricFamily("edgerun_coordinator_inbox_messages",
                            "Messages received and waiting to be stored",
                            value=stats.get("inbox", 0))
    age = GaugeMetricFamily("edgerun_coordinator_health_age_seconds",
                            "Delay from a device making a health to the coordinator "
                            "storing it (recent)", labels=["quantile"])
    for qname, quantile in (("p50", "0.5"), ("p99", "0.99")):
        value = (stats.get("health_age_s") or {}).get(qname)
        if isinstance(value, int | float):
            age.add_metric([quantile], float(value))
    yield age
    yield from _queues(stats)
    hook = stats.get("webhook")
    if isinstance(hook, Mapping):  # configured: delivery outcomes of the alert webhook
        sent = CounterMetricFamily("edgerun_coordinator_webhook_deliveries_total",
                                   "Alert webhook POSTs since the coordinator started, by "
                                   "outcome (retries: attempts after a failure)",
                                   labels=["outcome"])
        for outcome in ("sent", "retries", "failed", "dropped", "dropped_at_stop"):
            sent.add_metric([outcome], _count(hook.get(outcome)))
        yield sent
        yield GaugeMetricFamily("edgerun_coordinator_webhook_queue",
                                "Alerts waiting for the webhook receiver",
                                value=_count(hook.get("queue")))


def _queues(stats: Mapping[str, Any]) -> Iterator[Metric]:
    """Every bounded queue's depth, bound and overflow; coalesced work; the store's shares."""
    queues = stats.get("queues") or {}
    size = GaugeMetricFamily("edgerun_coordinator_queue_size", "Items held in each bounded "
                             "queue (inbox, replies awaited, coalescers' keys)",
                             labels=["queue"])
    bound = GaugeMetricFamily("edgerun_coordinator_queue_bound", "Each queue's bound",
                              labels=["queue"])
    over = CounterMetricFamily("edgerun_coordinator_queue_overflow_total", "Items dropped at "
                               "a queue's bound since start", labels=["queue"])
    merged = CounterMetricFamily("edgerun_coordinator_coalesced_total", "Messages folded "
                                 "into a later one of the same device (latest wins)",
                                 labels=["kind"])
    for name, q in sorted(queues.items()) if isinstance(queues, Mapping) else ():
        if not isinstance(q, Mapping):
            continue
        size.add_metric([name], _count(q.get("size", q.get("keys"))))
        bound.add_metric([name], _count(q.get("max", q.get("max_keys"))))
        over.add_metric([name], _count(q.get("dropped", q.get("forgotten"))))
        if "coalesced" in q:
            merged.add_metric([name], _count(q.get("coalesced")))
    yield from (size, bound, over, merged)
    usage = stats.get("store_usage") or {}
    held = GaugeMetricFamily("edgerun_device_store_bytes", "Logical bytes of the device's "
                             "rows in the coordinator's store (its fair share: "
                             "edgerun_coordinator_store_budget_bytes / devices)",
                             labels=["device"])
    refused = CounterMetricFamily("edgerun_device_refused_over_share_total", "Messages of "
                                  "the device refused while it was over its share of a full "
                                  "store", labels=["device"])
    if isinstance(usage, Mapping):
        for device, n in sorted((usage.get("by_device") or {}).items()):
            held.add_metric([str(device)], _count(n))
        for device, n in sorted((usage.get("refused_over_share") or {}).items()):
            refused.add_metric([str(device)], _count(n))
        yield GaugeMetricFamily("edgerun_coordinator_store_budget_bytes", "The devices' "
                                "logical budget under max_store_mb (0: no cap)",
                                value=_count(usage.get("budget_bytes")))
    yield from (held, refused)


def _count(value: Any) -> float:
    """A counter read from stats, 0 when it is not a usable number."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else 0.0


def registry(coordinator: Coordinator) -> CollectorRegistry:
    """A registry with the fleet collector and this process's CPU/memory/file figures."""
    reg = CollectorRegistry()
    reg.register(FleetCollector(coordinator))
    ProcessCollector(registry=reg)
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    """The text exposition (format 0.0.4) of a registry."""
    return generate_latest(reg)
