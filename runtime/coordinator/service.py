"""The coordinator process: MQTT in, SQLite store, acks and commands out, fleet view.

Threads: `mqtt` owns the paho client (receives into a queue, publishes acks and commands
handed to it); `ingest` validates and stores messages in batches (one transaction per batch)
and then queues the acks, so an ack never covers a result that is not committed; `http`
serves the JSON API. The fleet view is updated with the pure functions of `fleet.py`.

The MQTT session is persistent (fixed client id, clean session off, MQTT 5 session expiry), so
the broker queues fleet traffic while the coordinator restarts; past the broker's queue limit
it drops, and the devices re-send what was never acked.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from dataclasses import asdict
from typing import Any

import paho.mqtt.client as mqtt

from runtime.coordinator import fleet
from runtime.coordinator.config import CoordinatorConfig
from runtime.coordinator.store import Store
from runtime.telemetry import commands, payloads
from runtime.telemetry.mqtt import Backoff, ProtocolProbe, connect, make_client

log = logging.getLogger("edgerun.coordinator")

_INBOUND = ("state", "result", "health", "event", "cmd/reply")


class UnknownDevice(KeyError):
    """A command was addressed to a device the coordinator has never heard from."""


class Coordinator:
    """One coordinator instance (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig):
        self.cfg = cfg
        self.fleet_cfg = fleet.FleetConfig(cfg.stale_after_s, cfg.offline_after_s,
                                           cfg.backlog_alert, cfg.slo_alert)
        self.store = Store(cfg.store, cfg.fsync)
        self._key = commands.load_private_key(cfg.signing_key) if cfg.signing_key else None
        self._views_lock = threading.Lock()
        self.views: dict[str, fleet.DeviceView] = self._restore_views()
        self._inbox: queue.Queue = queue.Queue(maxsize=50_000)
        self._to_publish: queue.Queue = queue.Queue()
        self._waiters: dict[str, tuple[threading.Event, list]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connected = threading.Event()
        self._proto = ProtocolProbe(cfg.broker.protocol)
        self.counters: collections.Counter = collections.Counter()
        self.health_age_s: collections.deque = collections.deque(maxlen=20_000)

    def _restore_views(self) -> dict[str, fleet.DeviceView]:
        now = time.time()
        views = {}
        health = self.store.latest_health()
        for device, state in self.store.states().items():
            v = fleet.on_state(fleet.DeviceView(device), state, now)
            if device in health:
                v = fleet.on_activity(v, health[device]["t"], health[device])
            views[device] = v
        return fleet.refresh(views, now, self.fleet_cfg)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the MQTT and ingest threads."""
        for name, target in (("mqtt", self._mqtt_loop), ("ingest", self._ingest_loop),
                             ("retention", self._retention_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the threads (stored data is already committed) and close the store."""
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self.store.close()

    # -- MQTT thread ---------------------------------------------------------------------------

    def _filters(self) -> list[tuple[str, int]]:
        out = []
        for kind in _INBOUND:
            base = f"{payloads.PREFIX}/{self.cfg.fleet}/+/{kind}"
            # Retained messages are not delivered on shared subscriptions, so every
            # coordinator sees every state (idempotent); the rest is shared.
            shared = self.cfg.share_group and kind != "state"
            out.append((f"$share/{self.cfg.share_group}/{base}" if shared else base, 1))
        return out

    def _mqtt_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            protocol = self._proto.current
            client = make_client(self.cfg.broker, self.cfg.client_id, protocol, clean=False)
            client.max_inflight_messages_set(200)
            client.on_connect = self._on_connect
            client.on_message = self._on_message
            try:
                connect(client, self.cfg.broker, protocol, clean=False,
                        session_expiry_s=self.cfg.session_expiry_s)
            except (OSError, ValueError) as e:
                self.counters["connect_failures"] += 1
                if backoff.attempts % 10 == 0:
                    log.warning("broker %s:%d unreachable (%s); retrying", self.cfg.broker.host,
                                self.cfg.broker.port, e)
                self._proto.failed()
                self._stop.wait(backoff.next_delay())
                continue
            started = time.monotonic()
            while not self._stop.is_set():
                if client.loop(timeout=0.01) != mqtt.MQTT_ERR_SUCCESS:
                    break
                if not self.connected.is_set() and time.monotonic() - started > 10:
                    break
                self._publish_queued(client)
            if self.connected.is_set() and not self._stop.is_set():
                log.warning("lost the broker; reconnecting (the broker keeps our session)")
                backoff.reset()
            else:
                self._proto.failed()
            self.connected.clear()
            with contextlib.suppress(Exception):
                client.disconnect()
            if not self._stop.is_set():
                self._stop.wait(backoff.next_delay())

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.error("broker refused the coordinator: %s", reason_code)
            return
        self.counters["connects"] += 1
        self._proto.succeeded()
        client.subscribe(self._filters())
        self.connected.set()
        log.info("coordinator connected to %s:%d, fleet %s%s", self.cfg.broker.host,
                 self.cfg.broker.port, self.cfg.fleet,
                 f", shared group {self.cfg.share_group}" if self.cfg.share_group else "")

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        try:
            self._inbox.put((msg.topic, msg.payload, time.time()), timeout=1.0)
        except queue.Full:
            # Overloaded: the device re-sends unacked results, health is periodic anyway.
            self.counters["inbox_full_dropped"] += 1

    def _publish_queued(self, client: mqtt.Client) -> None:
        while True:
            try:
                topic, body = self._to_publish.get_nowait()
            except queue.Empty:
                return
            client.publish(topic, body, qos=1)

    # -- ingest thread -------------------------------------------------------------------------

    def _ingest_loop(self) -> None:
        last_refresh = last_prune = 0.0
        while not self._stop.is_set():
            batch = []
            try:
                batch.append(self._inbox.get(timeout=0.2))
                while len(batch) < self.cfg.ingest_batch:
                    batch.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if batch:
                try:
                    self._ingest(batch)
                except Exception:  # the store failing must not kill ingest; devices re-send
                    self.counters["ingest_errors"] += 1
                    log.exception("storing a batch of %d messages failed; devices will re-send",
                                  len(batch))
                if self.cfg.ingest_delay_s:
                    time.sleep(self.cfg.ingest_delay_s)
            now = time.time()
            if now - last_refresh >= 1.0:
                last_refresh = now
                self._refresh(now)
            if now - last_prune >= 3600:
                last_prune = now
                self.store.prune(self.cfg.keep_health_s, self.cfg.keep_events_s)

    def _ingest(self, batch: list[tuple[str, bytes, float]]) -> None:
        results, health, events, states, replies = [], [], [], [], []
        for topic_name, raw, _ in batch:
            parsed = payloads.parse_topic(topic_name)
            if parsed is None or parsed[0] != self.cfg.fleet:
                self.counters["foreign_topic"] += 1
                continue
            _, device, kind = parsed
            try:
                msg = payloads.decode(kind, raw)
            except payloads.PayloadError as e:
                self.counters["malformed"] += 1
                log.warning("malformed %s from %s: %s", kind, device, e)
                continue
            self.counters[kind] += 1
            {"result": results, "health": health, "event": events, "state": states,
             "cmd/reply": replies}[kind].append((device, msg))
        acks = self.store.ingest(results, health, events, states)
        for (device, stream), seq in acks.items():
            body = payloads.encode("ack", {"v": payloads.VERSION, "stream": stream, "seq": seq})
            self._to_publish.put((payloads.topic(self.cfg.fleet, device, "ack"), body))
        self.counters["results_stored_msgs"] += len(results)
        now = time.time()
        with self._views_lock:
            for device, msg in states:
                view = self.views.get(device) or fleet.DeviceView(device)
                self.views[device] = fleet.on_state(view, msg, now)
            seen = {d for d, _ in results} | {d for d, _ in events}
            for device in seen:
                self.views[device] = fleet.on_activity(
                    self.views.get(device) or fleet.DeviceView(device), now)
            for device, h in health:
                self.views[device] = fleet.on_activity(
                    self.views.get(device) or fleet.DeviceView(device), now, h)
                self.health_age_s.append(now - h["t"])
        for _, reply in replies:
            waiter = self._waiters.get(reply["id"] or "")
            if waiter:
                waiter[1].append(reply)
                waiter[0].set()

    def _refresh(self, now: float) -> None:
        with self._views_lock:
            before = self.views
            self.views = fleet.refresh(before, now, self.fleet_cfg)
            changes = fleet.transitions(before, self.views)
        for device, old, new in changes:
            log.info("device %s: %s -> %s", device, old, new)

    # -- retention thread (store size and age; see Store.prune_results) ----------------------

    def _retention_loop(self) -> None:
        while not self._stop.wait(self.cfg.retention_interval_s):
            try:
                self.run_retention()
            except Exception:  # a failed pass is retried next interval; ingest is unaffected
                if self._stop.is_set():
                    return
                self.counters["retention_errors"] += 1
                log.exception("retention pass failed; retrying in %.0f s",
                              self.cfg.retention_interval_s)

    def run_retention(self) -> dict[str, int]:
        """One retention pass: results past `retention_days`, then the oldest data while the
        store uses more than `max_store_mb`. Logs what it deleted and counts it in stats."""
        cfg = self.cfg
        done = self.store.prune_results(cfg.retention_days * 86400,
                                        int(cfg.max_store_mb * 1024 * 1024))
        self.counters["retention_runs"] += 1
        for key, n in done.items():
            self.counters[f"pruned_{key}"] += n
        if done["results_by_age"]:
            log.info("retention: deleted %d acked results older than %g days",
                     done["results_by_age"], cfg.retention_days)
        by_size = {k: n for k, n in done.items() if k.endswith("by_size") and n}
        if by_size:
            log.warning("retention: the store was over max_store_mb = %g; deleted the oldest "
                        "%s (now %.1f MB)", cfg.max_store_mb,
                        ", ".join(f"{n} {k.split('_')[0]}" for k, n in by_size.items()),
                        self.store.used_bytes() / 2**20)
        return done

    # -- queries and commands (any thread) ----------------------------------------------------

    def fleet_view(self) -> list[dict[str, Any]]:
        """Every device's view, for `fleet ls` and the API."""
        self._refresh(time.time())
        with self._views_lock:
            views = sorted(self.views.values(), key=lambda v: v.device)
        counts = self.store.counts()
        return [{**asdict(v), "results_stored": counts.get(v.device, 0)} for v in views]

    def device_view(self, device: str) -> dict[str, Any]:
        """One device in detail: view, acks, recent events."""
        self._refresh(time.time())
        with self._views_lock:
            view = self.views.get(device)
        if view is None:
            raise UnknownDevice(device)
        acks = {s: a for (d, s), a in self.store.acks().items() if d == device}
        return {**asdict(view), "results_stored": self.store.counts().get(device, 0),
                "acked": acks, "events": self.store.events(device, 20)}

    def stats(self) -> dict[str, Any]:
        """Ingest counters and the health age distribution."""
        ages = sorted(self.health_age_s)
        def pct(q):
            return (ages[min(len(ages) - 1, int(q * len(ages)))] if ages else None)
        return {"counters": dict(self.counters), "inbox": self._inbox.qsize(),
                "health_age_s": {"p50": pct(0.5), "p99": pct(0.99), "n": len(ages)},
                "connected": self.connected.is_set()}

    def send_command(self, device: str, name: str, args: dict[str, Any] | None = None,
                     ttl_s: float = 60.0, wait_s: float = 10.0) -> dict[str, Any] | None:
        """Sign and publish a command; returns the device's reply, or None on timeout."""
        if self._key is None:
            raise PermissionError("no signing_key configured: this coordinator cannot command")
        with self._views_lock:
            if device not in self.views:
                raise UnknownDevice(device)
        env = commands.sign(self._key, device, name, args, ttl_s)
        event, box = threading.Event(), []
        self._waiters[env["id"]] = (event, box)
        try:
            self._to_publish.put((payloads.topic(self.cfg.fleet, device, "cmd"),
                                  payloads.encode("cmd", env)))
            event.wait(wait_s)
        finally:
            self._waiters.pop(env["id"], None)
        return box[0] if box else None
