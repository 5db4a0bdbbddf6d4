"""The coordinator process: MQTT in, SQLite store, acks and commands out, fleet view.

Threads: `mqtt` owns the paho client (receives into a queue, publishes acks and commands
handed to it); `ingest` validates and stores messages in batches (one transaction per batch)
and then queues the acks, so an ack never covers a result that is not committed; `http`
serves the JSON API. The fleet view is updated with the pure functions of `fleet.py`.

The MQTT session is persistent (fixed client id, clean session off, MQTT 5 session expiry), so
the broker queues fleet traffic while the coordinator restarts; past the broker's queue limit
it drops, and the devices re-send what was never acked.

Trust boundary: every inbound message is admitted one at a time (topic, size- and
depth-limited JSON, schema, timestamps not ahead of our clock, reply signatures); whatever
fails, including an unexpected exception while handling it, is quarantined — a row in the
store's `quarantine` table (device, topic, reason, size, time), a per-device count in the
fleet view (`quarantined`), a line in the log once per kind per minute — and the loop goes on.

The ingest thread's jobs have rooms of their own: admission.py (the trust boundary for a
batch, and the coalescing of healths and events), births.py (a stored batch's events and
births into the rollouts), alerting.py (a refresh's alert transitions: logged, listed,
claimed, sent to the webhook); the store's own rooms are behind store.py. The Coordinator
keeps the threads, the fleet view and its lock, the acks and the queries.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from runtime.config.coordinator import CoordinatorConfig, redacted_url
from runtime.coordinator import coord_stats, fleet
from runtime.coordinator.admission import INBOUND, Admission
from runtime.coordinator.ageing import Ageing
from runtime.coordinator.alerting import Alerting
from runtime.coordinator.births import Births
from runtime.coordinator.bundle_chunks import ChunkServer
from runtime.coordinator.bundles import Shelf, held_now
from runtime.coordinator.clock_place import Placer
from runtime.coordinator.commander import Commander, Refused, UnknownDevice, no_reply
from runtime.coordinator.dialect import is_url
from runtime.coordinator.inbox import Inbox, sender
from runtime.coordinator.ingest_window import WindowCount, window_s
from runtime.coordinator.retention import Retention
from runtime.coordinator.rollout import Rollouts
from runtime.coordinator.store import LAST_SEEN_WRITE_S, Inbound, Store
from runtime.coordinator.store_open import running_error
from runtime.coordinator.store_watch import Said, StoreWatch
from runtime.wire import clock as wire_clock
from runtime.wire import payloads
from runtime.wire.brokerauth import BrokerAuth
from runtime.wire.mqtt import Connection
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.coordinator")

RECENT_S = coord_stats.RECENT_S  # (callers import it from here)


def place_times(clocks: Placer, inbound: list[Inbound], counters: collections.Counter,
                rlog: RateLimitedLog) -> None:
    """Unsynced devices' times placed where an offset is known, and results stored
    before one was known rewritten (a failure costs the placing, never the batch)."""
    try:
        clocks.before_store(inbound)
        clocks.settle()
    except Exception as e:
        counters["clock_place_errors"] += 1
        rlog.log("clock-place", "placing unsynced devices' times failed: %s; their "
                 "claimed times are kept", e, level=logging.ERROR)


def say(lines: list[Said]) -> None:
    """Log what the store's watch said (store_watch.py)."""
    for said in lines:
        log.log(said.level, "%s", said.text)


def watch_loop(c: Coordinator) -> None:
    """The watchdog thread: `Coordinator.watch_tick` each second until the coordinator
    stops."""
    while not c._stop.wait(1.0):
        c.watch_tick()


def hand_replies(commander: Commander, replies: list[tuple[str, dict, str, int]], now: float,
                 bad: list[tuple[str, str, str, int, float]]) -> None:
    """Hand a batch's command replies to their waiters; a refused one goes to `bad`."""
    for device, reply, topic_name, size in replies:
        try:
            commander.on_reply(device, reply)
        except Refused as e:
            bad.append((device, topic_name, str(e), size, now))


def publish_acks(conn: Connection, fleet_name: str, acks: dict) -> None:
    """Publish the acks of what a batch committed."""
    for (device, _stream), per_floor in acks.items():
        for ack in per_floor:
            body = payloads.encode("ack", {"v": payloads.VERSION, "stream": ack.stream,
                                           "seq": ack.seq, "from": ack.first})
            conn.publish(payloads.topic(fleet_name, device, "ack"), body)


def quarantine(store: Store, counters: collections.Counter, rlog: RateLimitedLog,
               bad: list[tuple[str, str, str, int, float]]) -> None:
    """Count, log (rate-limited) and record in the store what a batch refused."""
    counters["quarantined"] += len(bad)
    for _device, topic_name, why, size, _ in bad:
        kind = topic_name.rsplit("/", 1)[-1][:32]
        rlog.log(f"q-{kind}", "quarantined a %s message (%d bytes) on %s: %s", kind,
                 size, topic_name[:200], why[:300])
    try:
        counters["quarantine_rows_summarised"] += store.quarantine(bad)
    except Exception as e:  # counting must not fail the batch that was stored
        rlog.log("q-store", "could not record quarantined messages: %s", e,
                 level=logging.ERROR)


class Coordinator:
    """One coordinator instance (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig):
        self.cfg = cfg
        self.fleet_cfg = fleet.FleetConfig(cfg.stale_after_s, cfg.offline_after_s,
                                           cfg.backlog_alert, cfg.slo_alert,
                                           wake_margin_s=cfg.wake_margin_s)
        self.store = Store(cfg.store, cfg.fsync, cfg.store_margin, cfg.store_read_timeout_s)
        # monotonic, simulated in tests: the store's watchdog, reply expiry, births' windows
        self.mono = time.monotonic
        # the fleet view's silence and the alerts' delays: steady time, the wall clock's steps
        # apart (ageing.py; the module's clocks looked up at each read: tests replace them)
        self.clock = wire_clock.StepClock(lambda: time.time(), lambda: time.monotonic())
        self.store_watch = StoreWatch(redacted_url(cfg.store) if is_url(cfg.store)
                                      else cfg.store, cfg.store_stall_s)
        # another coordinator on this store reads `last_seen` from it: well inside its stale
        self.store.last_seen_write_s = min(LAST_SEEN_WRITE_S, cfg.stale_after_s / 4)
        # the group commit, short enough that a live device never looks stale behind it
        self.ingest_window_s = window_s(cfg.ingest_window_s, cfg.stale_after_s)
        if self.ingest_window_s < cfg.ingest_window_s:
            log.info("ingest_window_s %.3g s shortened to %.3g s (an eighth of stale_after_s "
                     "%.3g s: messages wait that long before the fleet view sees them)",
                     cfg.ingest_window_s, self.ingest_window_s, cfg.stale_after_s)
        # unsynced devices' times placed once their clock is (runtime/coordinator/clock_place.py)
        self.clocks = Placer(self.store, keep_s=max(cfg.keep_health_s, cfg.keep_events_s))
        self.api_url = cfg.public_url.rstrip("/")  # set by api.serve when empty
        # groups, desired state, staged rollouts: commands through the commander (below)
        self.rollouts = Rollouts(self.store,
                                 lambda *a, **k: self.commander.send_async(*a, **k),
                                 self.deploy_args,
                                 lambda: list(self.views), cfg.rollout_timeout_s,
                                 lambda d: sleep_of(self.views.get(d)), cfg.wake_margin_s,
                                 settle=lambda b: held_now(self.store, b))
        # bundles live in the store: every coordinator sharing it serves every bundle
        self.shelf = Shelf(self.store, int(cfg.max_bundle_mb * 1024 * 1024), cfg.client_id)
        _import_legacy_shelf(self.shelf, cfg)
        # bundles over MQTT for devices without a route to the API (its own connection)
        self.chunks = ChunkServer(cfg.fleet, self.shelf, cfg.broker, cfg.client_id,
                                  cfg.share_group)
        self._views_lock = threading.Lock()
        self._rlog = RateLimitedLog(log)
        self.counters: collections.Counter = collections.Counter()
        # signed commands out, their replies awaited and verified (commander.py); the
        # publish is looked up at each call (tests and benches replace it)
        self.commander = Commander(
            cfg, lambda topic, body: self._conn.publish(topic, body), self._view,
            self.counters, self._rlog,
            on_setting=lambda d, n, a: self.rollouts.record_setting(d, n, a),
            on_reply=lambda d, n, r: self.rollouts.on_reply(d, n, r), clock=lambda: self.mono())
        # which views a refresh recomputes (touched, or due by silence) and the version counts
        self._ageing = Ageing()
        self._fleet_version: str | None = None
        self._seen: dict[str, float] = {}  # device -> `updated` of its row merged here
        self.views = _restored_views(self.store, self.fleet_cfg)
        self._views_loaded = self.clock.read()[0]  # last full read of the store's `devices`
        # a share per device (inbox.py): one device flooding its topic held the whole
        # queue, starved every other device's ingest and blocked the MQTT thread
        self._inbox = Inbox(maxsize=50_000)
        # Bounded work per message: healths and repeated events coalesce per device in
        # admission, births in births.py (coalesce.py); commands sent without waiting are
        # the commander's
        self.admission = Admission(cfg, self.counters)
        self.births = Births(cfg, self.store, self.rollouts, self.counters, self._rlog,
                             lambda: self.mono())
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Persistent session (fixed id, clean off, MQTT 5 expiry): the broker queues for us
        # while we restart. A takeover of that id is logged and counted.
        self._conn = Connection(
            cfg.broker, cfg.client_id, name="mqtt", subscriptions=self._filters(),
            on_message=self._on_message, on_connected=self._on_connected,
            on_takeover=self._on_takeover, clean=False,
            session_expiry_s=cfg.session_expiry_s, max_inflight=200,
            max_packet_bytes=payloads.MAX_PACKET)  # a device's 256 MB message: not ours
        self.connected = self._conn.subscribed  # set once subscribed: nothing is missed
        # results by age and by size, stalled streams, the shelf's orphans (retention.py)
        self.retention = Retention(cfg, self.store, self.shelf, self.counters, self._stop)
        self.retention.sweep_shelf(at_start=True)  # what an upload killed last run left
        self.retention.set_cap()  # the fair shares (quotas.py) from the first batch on
        self.health_ages = coord_stats.HealthAges()  # stats' health_age_s
        self._counts: tuple[float, float, dict[str, int] | None] = (0.0, 0.0, None)
        # alert transitions from each refresh: logged, listed, claimed, sent (alerting.py);
        # an offline alert the run before was still holding back is told by this one
        self.alerting = Alerting(cfg, self.store, self.counters, self._rlog, self.views,
                                 lambda t: t + self.clock.step)
        self.alert_log, self.webhook = self.alerting.log, self.alerting.webhook

    @property
    def views(self) -> dict[str, fleet.DeviceView]:
        """Every device's view (updated in place under the views lock)."""
        return self._views

    @views.setter
    def views(self, value: dict[str, fleet.DeviceView]) -> None:
        # replaced whole (at start, by tests): every device is due at the next refresh
        self._views = value
        self._ageing.reset(value, self.clock.step)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the MQTT and ingest threads (after bringing the broker's ACL up to date when
        `broker_dir` is set)."""
        if self.cfg.broker_dir:
            try:
                BrokerAuth(self.cfg.broker_dir).refresh_acl()  # logs when it rewrote it
            except Exception as e:  # the broker's files must never stop the coordinator
                log.error("could not bring the broker ACL in %s up to date: %s (devices may "
                          "be refused the topics added since it was written, e.g. bundles "
                          "over MQTT; `edgerun fleet acl --broker-dir %s`)",
                          self.cfg.broker_dir, e, self.cfg.broker_dir)
        self._conn.start()
        self.chunks.start()
        if self.webhook is not None:
            self.webhook.start()
        for name, target in (("ingest", self._ingest_loop), ("retention", self.retention.loop),
                             ("watchdog", lambda: watch_loop(self))):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the threads (stored data is already committed) and close the store."""
        self._stop.set()
        self.retention.due.set()  # the retention loop sees the stop at once
        self._conn.stop()
        for t in self._threads:
            t.join(5)
        if self.webhook is not None:
            self.webhook.stop()
        self.chunks.stop()
        self.store.close()
        self.shelf.close()

    def threads_alive(self) -> dict[str, bool]:
        """Whether each of the coordinator's threads runs (for tests and stats)."""
        return {"mqtt": self._conn.alive(), **{t.name: t.is_alive() for t in self._threads},
                **({"webhook": self.webhook.alive()} if self.webhook is not None else {})}

    def _on_takeover(self, why: str) -> None:
        self.counters["takeovers"] += 1
        log.error("coordinator MQTT session: %s", why)

    # -- MQTT thread ---------------------------------------------------------------------------

    def _filters(self) -> list[tuple[str, int]]:
        out = []
        for kind in INBOUND:
            base = f"{payloads.PREFIX}/{self.cfg.fleet}/+/{kind}"
            # Retained messages are not delivered on shared subscriptions, so every
            # coordinator sees every state (idempotent); command replies go to every
            # coordinator too, so the one that sent the command gets its reply whichever
            # coordinator the device's traffic lands on; the rest is shared.
            shared = self.cfg.share_group and kind not in ("state", "cmd/reply")
            out.append((f"$share/{self.cfg.share_group}/{base}" if shared else base, 1))
        return out

    def _on_connected(self, client: mqtt.Client) -> None:
        log.info("coordinator connected to %s:%d, fleet %s%s", self.cfg.broker.host,
                 self.cfg.broker.port, self.cfg.fleet,
                 f", shared group {self.cfg.share_group}" if self.cfg.share_group else "")

    def _on_message(self, client: mqtt.Client, msg: mqtt.MQTTMessage) -> None:
        try:
            why = self._inbox.offer((msg.topic, msg.payload, time.time()))
        except Exception as e:  # e.g. a topic paho could not decode; never into paho's loop
            self.counters["receive_errors"] += 1
            self._rlog.log("receive", "could not take a message off the wire: %s", e)
            return
        # refused at once, never blocking this thread: it reads every device's traffic (inbox.py)
        who = sender(msg.topic)
        if why == "share":  # a device that behaves never has that many waiting
            self._rlog.log("inbox-share", "device %s has %d messages waiting in the "
                           "inbox, its share; its next ones are dropped (%d so far)",
                           who[:64], self._inbox.per_device, self._inbox.dropped[who])
        elif why == "full":
            self.counters["inbox_full_dropped"] += 1
            self._rlog.log("inbox-full", "the inbox is full (%d messages: ingest is behind); "
                           "messages are dropped (%d so far), device %s holds the most",
                           self._inbox.maxsize, self.counters["inbox_full_dropped"],
                           self._inbox.top[:64])

    # -- ingest thread -------------------------------------------------------------------------

    def _ingest_loop(self) -> None:
        # intervals on the monotonic clock: a wall clock stepped back an hour froze the fleet
        # refresh for that hour, one stepped forward fired the hourly prune early
        last_refresh = last_prune = -float("inf")
        while not self._stop.is_set():
            batch = []
            try:
                batch.append(self._inbox.get(timeout=0.2))
                # group commit: what arrives within ingest_window_s shares one transaction
                # (each costs whole pages of WAL and checkpoint, however few rows it holds);
                # it ends early near a device's inflight cap, and for what someone awaits
                until = time.monotonic() + self.ingest_window_s
                count = WindowCount(self.cfg.ingest_window_results)
                end = count.add(batch[0][0], batch[0][1])
                while not end and len(batch) < self.cfg.ingest_batch:
                    wait = until - time.monotonic()
                    batch.append(self._inbox.get(timeout=wait) if wait > 0
                                 else self._inbox.get_nowait())
                    end = count.add(batch[-1][0], batch[-1][1])
            except queue.Empty:
                pass
            if batch or self.admission.held():
                try:
                    self._ingest(batch)
                except Exception as e:  # the store failing must not kill ingest; devices re-send
                    self.counters["ingest_errors"] += 1
                    # once a minute: a full disk fails every batch (a traceback each filled
                    # it); a damaged, full or read-only file is named, without the trace
                    why = running_error(getattr(self.store, "path", None), e)
                    self._rlog.log("ingest", "storing a batch of %d messages failed (%s); "
                                   "devices will re-send", len(batch), why or e,
                                   level=logging.ERROR, exc_info=why is None)
                if self.cfg.ingest_delay_s:
                    time.sleep(self.cfg.ingest_delay_s)
            (now, wall), mono = self.clock.read(), self.mono()
            # hung on the store, it holds ingest as a batch does: watched as one
            self.store_watch.begin(mono, "housekeeping (a fleet refresh or a prune)")
            try:  # housekeeping failing must not end ingest either
                if mono - last_refresh >= 1.0:
                    last_refresh = mono
                    self._refresh(now)
                    self.rollouts.tick(wall)  # stored times, shared: wall (docs/clocks.md)
                    self.commander.expire_pending(mono)
                    self.births.due(mono)
                if mono - last_prune >= 3600:
                    last_prune = mono
                    # not while the clock reads 1970 or past 2100 (Retention.age_now)
                    if (age_now := self.retention.age_now()) is not None:
                        self.store.prune(self.cfg.keep_health_s, self.cfg.keep_events_s,
                                         now=age_now)
            except Exception as e:
                self.counters["housekeeping_errors"] += 1
                self._rlog.log("housekeeping", "fleet refresh or store pruning failed: %s", e,
                               level=logging.ERROR)
            finally:
                say(self.store_watch.end(self.mono(), stored=False))
            say(self.store_watch.probe(self.mono, lambda: self.store.probe(time.time())))

    def _ingest(self, batch: list[tuple[str, bytes, float]]) -> None:
        """Admit, store and ack one batch, then update the views and the rollouts from what
        was stored; everything refused on the way is quarantined."""
        bad: list[tuple[str, str, str, int, float]] = []
        steady, now = self.clock.read()
        inbound, sources, replies = self.admission.batch(batch, now, bad)
        written: dict[str, tuple[float, fleet.DeviceView]] = {}
        self.store_watch.begin(self.mono())  # the batch's store work, watched from outside
        place_times(self.clocks, inbound, self.counters, self._rlog)
        items: list[tuple[int, int, str, int]] = []  # refused items marked (result_items.py)
        try:
            acks, refused = self.store.ingest(inbound, written, items, now=now)
        except Exception as e:
            say(self.store_watch.end(self.mono(), f"{type(e).__name__}: {e}"))
            # The store failed, not the devices: they did talk (a full store disk aged the
            # whole fleet stale, then offline, alerts and all) and an operator may be waiting
            # for a reply. Both go on; the results are not acked, so devices re-send them.
            self._into_views(list(enumerate(inbound)), sources, {}, now - steady, now, bad)
            hand_replies(self.commander, replies, now, bad)
            quarantine(self.store, self.counters, self._rlog, bad)
            raise
        try:  # whatever fails below, the batch's store work is over
            if self.store.over_budget:
                self.retention.due.set()  # the retention loop takes back what was borrowed
            for i, why in refused:
                bad.append((inbound[i].device, sources[i][0], why, sources[i][1], now))
            for i, seq, why, size in items:  # each once: its seq is done for the ack
                bad.append((inbound[i].device, sources[i][0], f"result seq {seq} of stream "
                            f"{inbound[i].msg['stream']} refused (its seq acked as refused): "
                            f"{why}", size, now))
            self.counters["result_items_refused"] += len(items)
            refused_idx = {i for i, _ in refused}
            publish_acks(self._conn, self.cfg.fleet, acks)
            self.counters["results_stored_msgs"] += sum(
                1 for i, m in enumerate(inbound) if m.kind == "result" and i not in refused_idx)
            stored = [(i, m) for i, m in enumerate(inbound) if i not in refused_idx]
            self._into_views(stored, sources, written, now - steady, now, bad)
            self.births.stored(stored)
            hand_replies(self.commander, replies, now, bad)
            quarantine(self.store, self.counters, self._rlog, bad)
        finally:  # a batch of nothing to store (healths held) says nothing of the store
            say(self.store_watch.end(self.mono(), stored=bool(inbound)))

    def watch_tick(self) -> None:
        """The watchdog's tick (every second, on a thread of its own: the ingest thread may be
        the one stuck): a store batch in flight too long logged, the coordinator's own
        `store` alert raised or cleared (sent on a thread of its own: the store's log may
        hang as the store does; the webhook is handed each first)."""
        try:
            mono = self.mono()
            say(self.store_watch.check(mono))
            with self._views_lock:
                changed = self.alerting.own(self.store_watch.alert(mono), self.clock.read()[0],
                                            self.views)
            if changed:
                self.alerting.send(background=True)
        except Exception as e:  # the watchdog must outlive anything it watches
            self._rlog.log("watchdog", "store watchdog: %s", e, level=logging.ERROR)

    def _into_views(self, stored: list[tuple[int, Inbound]], sources: list[tuple[str, int]],
                    written: dict[str, tuple[float, fleet.DeviceView]], step: float,
                    now: float, bad: list[tuple[str, str, str, int, float]]) -> None:
        """The stored messages into the fleet view, then the store's merged rows over it;
        `now` the wall time they were stamped at, `step` the clock's steps then (ageing.py)."""
        with self._views_lock:
            for i, m in stored:
                try:
                    self._update_view(m, now, step)
                except Exception as e:  # the view must survive any message
                    bad.append((m.device, sources[i][0], f"fleet view: {type(e).__name__}: {e}",
                                sources[i][1], now))
            # The store's merged view (every coordinator's messages) replaces ours, keeping
            # the alerts of the last refresh (its `before`); its row is then not read back.
            for device, (updated, merged) in written.items():
                held = self.views.get(device)
                self.views[device] = fleet.not_ahead(fleet.with_alerts(
                    merged, held.alerts if held else ()), now, self.clock.slack_s)
                self._seen[device] = updated

    def _update_view(self, m: Inbound, now: float, step: float | None = None) -> None:
        self._ageing.touch(m.device, step)
        view = self.views.get(m.device) or fleet.DeviceView(m.device)
        if m.kind == "state":
            view = fleet.on_state(view, m.msg, now)
        elif m.kind == "health":
            view = fleet.on_activity(view, now, m.msg)
            self.health_ages.add(m.msg)  # after the batch committed
        else:
            view = fleet.on_activity(view, now)
        self.views[m.device] = fleet.not_ahead(view, now, self.clock.slack_s)

    def _refresh(self, now: float) -> None:
        # `now`: steady time (self.clock: each device is aged at its own `now_of`, ageing.py)
        # The store's `devices` table is the truth (every coordinator sharing the store
        # writes it); this process's views fill in devices the table does not have yet.
        # Rows changed lately every call (3 s of margin for other hosts' clocks and long
        # transactions), all of them every 30 s; only rows whose `updated` stamp is not the
        # one merged here already are decoded (rows this process wrote never are): decoding
        # the 6,000 rows a 10,000-device fleet changes in 3 s cost 130 ms a second.
        full, step = now - self._views_loaded >= 30, self.clock.step
        wall = now + step  # the store's `updated` stamps are the writers' wall clocks
        shared = self.store.changed_views(None if full else wall - 3, self._seen)
        if full:
            self._views_loaded = now
        with self._views_lock:
            # Only the devices touched since the last refresh (a message here, a row from
            # the store) and those whose silence threshold passed are aged and re-alerted
            # (ageing.py): a refresh costs the devices changing, not the fleet.
            views, slack = self._views, self.clock.slack_s
            before = {d: views[d] for d in shared if d in views}
            for d, v in shared.items():  # other hosts' wall times: judged by ours from now
                views[d] = fleet.not_ahead(v, wall, slack)
                self._ageing.touch(d, step)
            # a device whose messages wait in the inbox is not silent: a store that hangs
            # must not age the fleet stale for the coordinator's own fault (looked at past
            # half its stale_after_s only: a device stored lately costs the refresh nothing)
            half = self.fleet_cfg.stale_after_s / 2
            for d, received in self._inbox.waiting().items():
                if d in views and self._ageing.now_of(d, now) - views[d].last_seen > half \
                        and (v := fleet.heard(views[d], received)) is not views[d]:
                    before.setdefault(d, views[d])
                    views[d] = fleet.not_ahead(v, wall, slack)
                    self._ageing.touch(d, step)
            due = self._ageing.take(now) | shared.keys()
            for d in due:
                if d in views:
                    before.setdefault(d, views[d])
                    self._ageing.count_version(d, views[d])
            version = self._ageing.majority()
            if version != self._fleet_version:  # every device's `version` alert may change
                self._fleet_version = version
                before = {**views, **before}
                due = set(views)
            after = fleet.refresh_some(views, sorted(due), lambda d: self._ageing.now_of(d, now),
                                       self.fleet_cfg, version)
            views.update(after)
            self.counters["views_recomputed"] += len(after)
            for d, v in after.items():
                self._ageing.schedule(d, v, self.fleet_cfg)
            changes = fleet.transitions(before, after)
            # under the lock: fleet_view() refreshes from HTTP threads too, and each
            # transition must be queued exactly once, in order
            self.alerting.refreshed(fleet.alert_changes(before, after), now, views)
        # its store writes outside the views lock, on a thread while the store may hang
        self.alerting.send(background=self.store_watch.busy(self.mono()))
        if len(changes) <= 20:
            for device, old, new in changes:
                log.info("device %s: %s -> %s", device, old, new)
            return
        # thousands of devices changing at once (a start, a broker outage): one line a kind,
        # not a line a device
        kinds: dict[tuple[str, str], list[str]] = {}
        for device, old, new in changes:
            kinds.setdefault((old, new), []).append(device)
        for (old, new), devices in sorted(kinds.items()):
            log.info("%d devices %s -> %s: %s%s", len(devices), old, new,
                     ", ".join(devices[:10]), ", ..." if len(devices) > 10 else "")

    def alerts_view(self, limit: int = 200) -> dict[str, Any]:
        """Active alerts of every device (with when each was raised, None when it was
        already active at start), those clearing (gone, but not for alert_clear_s yet: the
        clear is recorded at `settles_at` unless they come back first) and the newest alert
        transitions, newest first."""
        self._refresh(self.clock.read()[0])
        stored = self.alerting.stored(limit)  # the same on every coordinator sharing it
        with self._views_lock:
            out = self.alerting.listing(self.views, limit, stored)
        return {**out, "store": self.store_watch.status(self.mono())}

    # -- retention thread (store size and age; see Store.prune_results) ----------------------

    def run_retention(self) -> dict[str, int]:
        """One retention pass now (Retention.run): what it deleted, by kind."""
        return self.retention.run()

    # -- queries and commands (any thread) ----------------------------------------------------

    def result_counts(self) -> dict[str, int]:
        """Stored results per device. A scan of the results index (0.1-0.25 s a million rows,
        ingest waiting): a count that took over 20 ms is reused 20 times as long (<= 5 %)."""
        cached_at, took, counts = self._counts
        if counts is not None and time.monotonic() - cached_at < (took * 20 if took > 0.02
                                                                   else 0):
            return counts
        t0 = time.monotonic()
        counts = self.store.counts()
        self._counts = (time.monotonic(), time.monotonic() - t0, counts)
        return counts

    def fleet_view(self) -> list[dict[str, Any]]:
        """Every device's view, for `fleet ls` and the API."""
        self._refresh(self.clock.read()[0])
        with self._views_lock:
            views = sorted(self.views.values(), key=lambda v: v.device)
        counts, quarantined = self.result_counts(), self.store.quarantine_counts()
        return [{**asdict(v), "results_stored": counts.get(v.device, 0),
                 "quarantined": quarantined.get(v.device, 0)} for v in views]

    def device_view(self, device: str) -> dict[str, Any]:
        """One device in detail: view, acks, recent events."""
        self._refresh(self.clock.read()[0])
        with self._views_lock:
            view = self.views.get(device)
        if view is None:
            raise UnknownDevice(device)
        acks = {s: a for (d, s), a in self.store.acks().items() if d == device}
        return {**asdict(view), "results_stored": self.result_counts().get(device, 0),
                "acked": acks, "events": self.store.events(device, 20),
                "quarantined": self.store.quarantine_counts().get(device, 0),
                "desired": self.rollouts.desired(device),
                "quarantine": self.store.quarantined(device, 20)}

    def stats(self) -> dict[str, Any]:
        """Ingest counters and the health age distribution (coord_stats.stats)."""
        return coord_stats.stats(self)

    def queues(self) -> dict[str, dict[str, int]]:
        """Every queue and table of held work with its bound (coord_stats.queues)."""
        return coord_stats.queues(self)

    def _view(self, device: str) -> fleet.DeviceView | None:
        """One device's view, read under the views lock (the commander's look-up)."""
        with self._views_lock:
            return self.views.get(device)

    def send_command(self, device: str, name: str, args: dict[str, Any] | None = None,
                     ttl_s: float = 60.0, wait_s: float = 10.0) -> dict[str, Any] | None:
        """Sign and publish a command; the device's reply, or None on timeout
        (Commander.send_command says what a reply carries)."""
        return self.commander.send_command(device, name, args, ttl_s, wait_s)

    def no_reply(self, device: str, name: str, wait_s: float, ttl_s: float = 60.0) -> str:
        """What to tell the operator when `send_command` got no reply: the device's status
        now and what became of the command (commander.no_reply)."""
        now = self.clock.read()[0]
        self._refresh(now)
        with self._views_lock:
            now = self._ageing.now_of(device, now)  # the wall clock its last_seen is on
        return no_reply(self._view(device), name, wait_s, ttl_s, now)

    def deploy_args(self, bundle_id: str) -> dict[str, Any]:
        """The `deploy` command's arguments for a bundle held here (runtime/device/ota.py)."""
        held = self.shelf.get(bundle_id)
        if held is None:
            raise ValueError(f"no bundle {bundle_id!r} held by this coordinator")
        if not self.api_url:
            raise ValueError("no API address for devices to download from "
                             "(coordinator.public_url)")
        return {"name": held.name, "version": held.version, "size": held.size,
                "sha256": held.sha256, "token": held.token,
                "url": f"{self.api_url}/api/v1/bundles/{held.id}"}


def sleep_of(view: fleet.DeviceView | None) -> tuple[float, float] | None:
    """(since, wake_at) when a device's view says it announced a sleep, else None (a
    rollout does not count a sleeper's sleep against its verdict timeout). `since` is
    when this coordinator last heard it awake (its own clock: a device clock running
    behind must not make awake time count as asleep), else the announcement's stamp."""
    if view is None or not view.asleep:
        return None
    return (view.last_seen or view.state_t, view.wake_at)


def _import_legacy_shelf(shelf: Shelf, cfg: CoordinatorConfig) -> None:
    """Bundles an older coordinator kept in `bundles_dir` (its own directory and index)
    go into the store once, tokens kept, so rollouts under way still download."""
    legacy = cfg.bundles_dir or ("" if is_url(cfg.store) else
                                 str(Path(cfg.store).expanduser().parent / "bundles"))
    try:
        done = shelf.import_dir(legacy) if legacy else []
    except Exception as e:  # the old directory must not stop the coordinator starting
        log.error("could not import the bundles of %s into the store: %s", legacy, e)
        return
    if done:
        log.info("imported %d bundles from %s into the store (%s); the directory is no "
                 "longer used", len(done), legacy, ", ".join(done))


def _restored_views(store: Store, fleet_cfg: fleet.FleetConfig) -> dict[str, fleet.DeviceView]:
    """The fleet view from the stored states and latest health. A stored row that is not
    a valid message (a forged or older-format row) is quarantined and skipped: it must not
    stop the coordinator from starting."""
    now = time.time()
    views, bad = {}, []
    health = store.latest_health()
    for device, state in store.states().items():
        try:
            payloads.check("state", state)
            v = fleet.on_state(fleet.DeviceView(device), state, now)
            h = health.get(device)
            if h is not None:
                try:
                    payloads.check("health", h)
                    v = fleet.on_activity(v, min(h["t"], now), h)
                except payloads.PayloadError as e:
                    bad.append((device, "stored health", str(e)))
            views[device] = v
        except Exception as e:  # any stored row may be hostile
            bad.append((device, "stored state", f"{type(e).__name__}: {e}"))
    for device, what, why in bad:
        log.error("device %s: its %s row is invalid (%s); skipped at start", device, what,
                  why[:300])
    with contextlib.suppress(Exception):
        store.quarantine([(d, f"(store) {w}", why, 0, now) for d, w, why in bad])
    # the shared `devices` table, written by every coordinator on this store, wins
    return fleet.refresh({**views, **store.views()}, now, fleet_cfg)
