"""The Sparkplug B edge node's MQTT side: its own connection (its own will, the NDEATH), fed
by the daemon's health snapshots and the outbox's results, driven by session.py's table.

One thread (the `sparkplug` Connection) does every paho call and every session step; other
threads only hand it a health snapshot (`feed`) or wake it (the outbox's listener). The
native JSON tree stays the source of truth: this node reads the results the outbox stored,
with its own cursor (from the last seq at start, like `result/each`), into a bounded hold,
and publishes them while born; those read while not born (broker away, primary host offline)
go out afterwards as DDATA with `is_historical` and their own timestamps. A result the
coordinator acked before this thread read it is not seen (counted in `missed`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from runtime.config.sparkplug import SparkplugConfig, check_sparkplug_id
from runtime.config.telemetry import TelemetryConfig
from runtime.durable import write_atomic
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.sparkplug import payload as spb
from runtime.telemetry.sparkplug.metrics import (
    Tally,
    changed,
    ms,
    node_metrics,
    parse_result,
    publish_points,
    source_metrics,
    source_names,
    verdict_of,
)
from runtime.telemetry.sparkplug.session import (
    Action,
    Event,
    Kind,
    Phase,
    Session,
    may_publish_data,
    next_bd_seq,
    step,
    take_seq,
)
from runtime.wire import safejson
from runtime.wire.brokerauth import for_connection
from runtime.wire.events import EventType
from runtime.wire.mqtt import Connection
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.sparkplug")

RESULTS_PER_TICK = 500  # held results published per pass (the thread stays responsive)
MAX_STATE_BYTES = 1024  # a STATE message is ~50 bytes of JSON
POLL_S = 1.0  # the outbox is read this often even untold (results a disk-full flush stored)


@dataclass
class SparkplugStats:
    """What the node counts (logged; `stats()`)."""

    phase: str = "offline"
    bd_seq: int | None = None
    births: int = 0
    births_held: int = 0  # a birth waited for the rate bound
    data_messages: int = 0
    results: int = 0
    historical: int = 0
    dropped: int = 0  # held results beyond max_held_results, oldest first
    missed: int = 0  # results acked (deleted) before this node read them
    commands_refused: int = 0
    states_refused: int = 0  # malformed or stale STATE messages
    rebirths_requested: int = 0


class SparkplugNode:
    """The edge node (see module docstring). `event(type, severity, **fields)` records an
    event for the operator (the daemon's); `clock` is monotonic seconds (tests)."""

    def __init__(self, cfg: SparkplugConfig, telemetry: TelemetryConfig, device: str,
                 outbox: Outbox, state_dir: Path,
                 event: Callable[..., None] = lambda *a, **kw: None,
                 clock: Callable[[], float] = time.monotonic, triggered: Iterable[str] = ()):
        self.cfg, self.outbox, self._event, self._clock = cfg, outbox, event, clock
        self._triggered = frozenset(triggered)  # PLC-triggered sources: every result sent
        self.group = cfg.group_id or telemetry.fleet
        self.edge = cfg.edge_node_id or device
        for what, value in (("group id", self.group), ("edge node id", self.edge)):
            if why := check_sparkplug_id(f"sparkplug {what}", value):
                raise ValueError(why)
        self._bd_file = Path(state_dir) / "sparkplug-bdseq"
        self._bd_seq = self._load_bd_seq()  # the last one a will carried (None: never)
        self._session = Session(primary=bool(cfg.primary_host_id),
                                max_births=cfg.max_births_per_minute)
        self._health: dict[str, Any] | None = None  # the latest snapshot (any thread sets)
        self._health_seen: dict[str, Any] | None = None  # the one data was last made from
        self._held: collections.deque = collections.deque()  # (result, historical)
        self._cursor = outbox.last_seq()
        # the bounded rate (cfg.data_interval_s): the outbox is read at most once an
        # interval; `_unread` says it has rows since the last read, `_woken` that the
        # thread was already woken for them (one wake-up an interval, not one a frame)
        self._unread, self._woken = True, False
        self._next_read = 0.0
        self._tallies: dict[str, Tally] = {}
        self._born: set[str] = set()  # devices whose DBIRTH went out in this birth
        self._sent_node: dict[str, spb.Value] = {}
        self._sent_dev: dict[str, dict[str, spb.Value]] = {}
        self._last_event: dict[str, float] = {}
        self._rlog = RateLimitedLog(log)
        self.stats = SparkplugStats()
        self._t = {k: spb.topic(self.group, k, self.edge) for k in ("NBIRTH", "NDEATH",
                                                                   "NDATA", "NCMD")}
        subs = [(self._t["NCMD"], 1), (spb.topic(self.group, "DCMD", self.edge, "+"), 1)]
        if cfg.primary_host_id:
            subs.append((spb.state_topic(cfg.primary_host_id), 1))
        broker = for_connection(telemetry.broker, "sparkplug")
        self._conn = Connection(
            broker, broker.username or f"edgerun-spb-{self.group}-{self.edge}"[:200],
            name="sparkplug", subscriptions=subs, on_message=self._on_message,
            on_connected=self._on_connected, on_tick=self._on_tick, will=self._will,
            will_retain=False, on_error=self._callback_failed)
        outbox.listen(self._stored)

    # -- any thread -----------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (and keep reconnecting)."""
        self._conn.start()

    def feed(self, health: dict[str, Any]) -> None:
        """A new health snapshot (the daemon's, as it sends it): births and NDATA are made
        from the latest one."""
        self._health = health
        self._conn.wake()

    def _stored(self) -> None:
        """The outbox stored results (its writer's thread, once per batch: the frame path):
        two flags and a clock read; the thread is woken only when it may read them now
        (otherwise its next idle tick or due read takes them, within an interval)."""
        self._unread = True
        if not self._woken and self._clock() >= self._next_read:
            self._woken = True
            self._conn.wake()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish NDEATH (a clean DISCONNECT sends no will) and disconnect."""
        self._conn.stop(timeout_s, farewell=self._farewell)

    def alive(self) -> bool:
        """The node's thread is running."""
        return self._conn.alive()

    def report(self) -> dict[str, Any]:
        """The counters, with the session's phase and bdSeq."""
        return asdict(self.stats)

    # -- the connection's thread -------------------------------------------------------------

    def _load_bd_seq(self) -> int | None:
        try:
            value = int(self._bd_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return value if 0 <= value <= 255 else None

    def _will(self) -> tuple[str, bytes]:
        """The NDEATH will of the next connection: a new bdSeq, kept on disk first so a
        restarted daemon never reuses the one a broker may still publish for it."""
        self._bd_seq = next_bd_seq(self._bd_seq)
        try:
            write_atomic(self._bd_file, f"{self._bd_seq}\n")
        except OSError as e:  # the state disk refusing writes must not stop the node
            self._rlog.log("bdseq", "could not keep sparkplug bdSeq in %s: %s", self._bd_file, e)
        return self._t["NDEATH"], spb.death(self._bd_seq, ms(time.time()))

    def _farewell(self, client: mqtt.Client) -> mqtt.MQTTMessageInfo | None:
        if self._bd_seq is None:
            return None
        return client.publish(self._t["NDEATH"], spb.death(self._bd_seq, ms(time.time())),
                              qos=1)

    def _step(self, client: mqtt.Client, kind: Kind, **kw: Any) -> tuple[Action, ...]:
        was = self._session.phase
        self._session, actions = step(self._session, Event(
            kind, self._clock(), ready=self._health is not None, **kw))
        s = self._session
        self.stats.phase, self.stats.bd_seq = s.phase.value, s.bd_seq
        if s.phase == Phase.BIRTH_DUE and was != Phase.BIRTH_DUE and self._health is not None:
            self.stats.births_held += 1
        if Action.BIRTH in actions:
            self._birth(client)
        return actions

    def _on_connected(self, client: mqtt.Client) -> None:
        self._step(client, Kind.LOST)  # whatever was born is dead with the old connection
        # held results the old connection never sent are history now, like those stored
        # while it was away: their own time, is_historical
        self._held = collections.deque((r, True) for r, _ in self._held)
        self._read_outbox()  # what waited for the broker: history from now on
        self._step(client, Kind.CONNECTED, bd_seq=self._bd_seq or 0)
        log.info("sparkplug: connected as %s/%s (bdSeq %d)", self.group, self.edge,
                 self._bd_seq or 0)

    def _on_tick(self, client: mqtt.Client) -> None:
        self._step(client, Kind.TICK)
        now = self._clock()
        if now >= self._next_read and (self._unread or now >= self._next_read + POLL_S):
            self._next_read = now + self.cfg.data_interval_s
            self._read_outbox()
        if not may_publish_data(self._session):
            return
        if self._held:
            self._publish_held(client)
        health = self._health
        if health is not None and health is not self._health_seen:
            self._health_seen = health
            self._publish_health(client, health)

    def _read_outbox(self) -> None:
        """Move the results stored since the cursor into the hold (bounded)."""
        self._unread = self._woken = False  # before reading: a row stored meanwhile is seen
        while True:
            batch = self.outbox.pending(self._cursor, RESULTS_PER_TICK)
            if not batch:
                return
            if batch[0].seq > self._cursor + 1 and self._cursor:
                self.stats.missed += batch[0].seq - self._cursor - 1
            historical = not may_publish_data(self._session)
            for p in batch:
                r = parse_result(p.json)
                if r is not None:
                    self._held.append((r, historical))
            self._cursor = batch[-1].seq
            while len(self._held) > self.cfg.max_held_results:
                self._held.popleft()
                self.stats.dropped += 1
            if len(batch) < RESULTS_PER_TICK:
                return

    def _publish(self, client: mqtt.Client, topic: str, metrics: dict[str, spb.Value],
                 seq: int | None = None) -> None:
        if seq is None:
            self._session, seq = take_seq(self._session)
        info = client.publish(topic, spb.encode(metrics, ms(time.time()), seq), qos=0)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise ConnectionError(mqtt.error_string(info.rc))

    def _birth(self, client: mqtt.Client) -> None:
        """NBIRTH (seq 0, bdSeq, every node metric) then a DBIRTH for every source."""
        h = self._health or {}
        now = ms(time.time())
        metrics = {spb.BD_SEQ: spb.Value(spb.INT64, self._session.bd_seq, now),
                   spb.REBIRTH: spb.Value(spb.BOOLEAN, False, now), **node_metrics(h, now)}
        self._publish(client, self._t["NBIRTH"], metrics, seq=0)
        self._sent_node = metrics
        self._health_seen = h
        self._born = set()
        self._sent_dev = {}
        for name in dict.fromkeys([*source_names(h), *self._tallies]):
            self._device_birth(client, name, h, now)
        self.stats.births += 1
        log.info("sparkplug: born (bdSeq %d, %d devices)", self._session.bd_seq,
                 len(self._born))

    def _device_birth(self, client: mqtt.Client, name: str, h: dict[str, Any],
                      now: int) -> None:
        tally = self._tallies.setdefault(name, Tally())
        metrics = {**source_metrics(h, name, now), **tally.metrics(self.cfg.ok_labels)}
        self._publish(client, spb.topic(self.group, "DBIRTH", self.edge, name), metrics)
        self._sent_dev[name] = metrics
        self._born.add(name)

    def _publish_held(self, client: mqtt.Client) -> None:
        """Held results in seq order, coalesced by metrics.publish_points: history first-hand
        (every result metric, is_historical, its own time), live ones by exception at every
        verdict change and at each source's last. A result leaves the hold (and counts in
        its source's tally) only once a message carrying it went out: a ConnectionError
        midway keeps the rest, which go out as history after the reconnect."""
        snapshot = [self._held[i] for i in range(min(len(self._held), RESULTS_PER_TICK))]
        names = [r.get("source") if isinstance(r.get("source"), str) else "default"
                 for r, _ in snapshot]
        last_sent = {n: v.value for n, d in self._sent_dev.items()
                     if (v := d.get("Last Result/Verdict")) is not None}
        points = set(publish_points(
            [(n, verdict_of(r, self.cfg.ok_labels), h) for n, (r, h) in zip(
                names, snapshot, strict=True)], last_sent, self._triggered))
        done = [False] * len(snapshot)
        work: dict[str, Tally] = {}  # tallies with results not yet sent
        waiting: dict[str, list[int]] = {}  # those results, by source
        replayed: set[str] = set()
        i = 0
        try:
            for i, ((r, historical), name) in enumerate(zip(snapshot, names, strict=True)):
                if name not in self._born:
                    if check_sparkplug_id("source", name):
                        done[i] = True  # not a topic level Sparkplug allows (ours never are)
                        continue
                    self._device_birth(client, name, self._health or {}, ms(time.time()))
                tally = work.get(name) or replace(self._tallies[name])
                tally.add(r, self.cfg.ok_labels)
                work[name] = tally
                waiting.setdefault(name, []).append(i)
                if i not in points:
                    continue
                topic = spb.topic(self.group, "DDATA", self.edge, name)
                if historical:
                    self._publish(client, topic, tally.metrics(self.cfg.ok_labels, True))
                    self.stats.historical += 1
                    replayed.add(name)
                else:
                    self._data(client, topic, name, tally.metrics(self.cfg.ok_labels))
                self._tallies[name] = work.pop(name)  # sent: the results are the host's
                for j in waiting.pop(name):
                    done[j] = True
                    self.stats.results += 1
            for name in replayed:  # the live tags take the latest value, once
                self._data(client, spb.topic(self.group, "DDATA", self.edge, name),
                           name, self._tallies[name].metrics(self.cfg.ok_labels))
        except ConnectionError:
            raise  # the link: everything unsent is tried again on the next connection
        except Exception:  # a bug on one result: it must not stop every one after it
            if snapshot and not done[i]:
                done[i] = True
                self.stats.dropped += 1
            raise
        finally:
            for _ in snapshot:
                self._held.popleft()
            self._held.extendleft(reversed([x for x, sent in zip(snapshot, done, strict=True)
                                            if not sent]))

    def _data(self, client: mqtt.Client, topic: str, device: str,
              metrics: dict[str, spb.Value]) -> None:
        """DDATA with the metrics that moved past their deadband (none: nothing sent)."""
        sent = self._sent_dev.setdefault(device, {})
        delta = changed(sent, metrics, self.cfg)
        if delta:
            self._publish(client, topic, delta)
            sent.update(delta)
            self.stats.data_messages += 1

    def _publish_health(self, client: mqtt.Client, h: dict[str, Any]) -> None:
        now = ms(time.time())
        delta = changed(self._sent_node, node_metrics(h, now), self.cfg)
        if delta:
            self._publish(client, self._t["NDATA"], delta)
            self._sent_node.update(delta)
            self.stats.data_messages += 1
        for name in source_names(h):
            if name not in self._born:
                if check_sparkplug_id("source", name):
                    continue
                self._device_birth(client, name, h, now)
                continue
            self._data(client, spb.topic(self.group, "DDATA", self.edge, name), name,
                       source_metrics(h, name, now))

    # -- inbound ------------------------------------------------------------------------------

    def _on_message(self, client: mqtt.Client, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == self._t["NCMD"]:
            self._on_node_command(client, msg.payload)
        elif self.cfg.primary_host_id and msg.topic == spb.state_topic(self.cfg.primary_host_id):
            self._on_state(client, msg.payload)
        elif msg.topic.startswith(spb.topic(self.group, "DCMD", self.edge) + "/"):
            try:
                why = spb.refuse_device_command(msg.payload, self.cfg.max_command_bytes)
            except spb.CommandRefused as e:
                why = str(e)
            self._refused("DCMD", msg.topic, why)
        else:
            self._rlog.log("topic", "sparkplug: a message on %r, which it never subscribed to",
                           msg.topic[:200])

    def _on_node_command(self, client: mqtt.Client, raw: bytes) -> None:
        try:
            rebirth = spb.parse_node_command(raw, self.cfg.max_command_bytes)
        except spb.CommandRefused as e:
            self._refused("NCMD", self._t["NCMD"], str(e))
            return
        if rebirth:
            self.stats.rebirths_requested += 1
            self._step(client, Kind.REBIRTH)

    def _on_state(self, client: mqtt.Client, raw: bytes) -> None:
        """3.0 STATE: {"online": bool, "timestamp": ms}; anything else is refused."""
        try:
            state = safejson.loads(raw, max_bytes=MAX_STATE_BYTES)
            online, ts = state.get("online"), state.get("timestamp")
            if not isinstance(online, bool) or not isinstance(ts, int) or isinstance(
                    ts, bool) or not 0 <= ts < 1 << 63:
                raise ValueError("want {\"online\": bool, \"timestamp\": ms}")
        except (ValueError, AttributeError) as e:  # safejson's refusals are ValueErrors
            self.stats.states_refused += 1
            self._refused("STATE", spb.state_topic(self.cfg.primary_host_id), str(e)[:200],
                          count=False)
            return
        if Action.STALE_STATE in self._step(client, Kind.HOST_ONLINE if online
                                            else Kind.HOST_OFFLINE, host_ts=ts):
            self.stats.states_refused += 1
            self._rlog.log("stale", "sparkplug: ignored a STATE older than the last one (%d)",
                           ts)
        else:
            log.info("sparkplug: primary host %s is %s", self.cfg.primary_host_id,
                     "online" if online else "offline: holding data")

    def _refused(self, what: str, topic: str, why: str, count: bool = True) -> None:
        """A refused inbound message: logged, an event (one a minute per kind) and counted,
        in that order (whoever sees the count sees its event); nothing else changes."""
        self._rlog.log(what, "sparkplug: refused a %s on %s: %s", what, topic[:200], why)
        now = self._clock()
        if now - self._last_event.get(what, -1e18) >= 60:
            self._last_event[what] = now
            self._event(EventType.SPARKPLUG_REFUSED, "warning", message=what,
                        topic=topic[:256], reason=why[:1000])
        if count:
            self.stats.commands_refused += 1

    def _callback_failed(self, what: str, reason: str) -> None:
        self._rlog.log(what, "sparkplug: %s callback failed: %s", what, reason[:300])


def sparkplug_node(cfg: SparkplugConfig, telemetry: TelemetryConfig, device: str,
                   outbox: Outbox, state_dir: Path, event: Callable[..., None],
                   triggered: Iterable[str] = ()) -> SparkplugNode | None:
    """The node when `[sparkplug] enabled` and a broker is configured, else None (said).
    `triggered`: the sources a PLC triggers (every result of theirs is sent)."""
    if not cfg.enabled:
        return None
    if not telemetry.broker.host:
        log.warning("sparkplug.enabled needs a broker (telemetry.broker.host); no edge node")
        return None
    return SparkplugNode(cfg, telemetry, device, outbox, state_dir, event,
                         triggered=triggered)
