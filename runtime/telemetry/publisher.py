"""The device's MQTT side: one thread owns the paho client and drains the outbox.

paho is not thread-safe (its client's state is shared with its network loop, unlocked), so
every paho call — connect, loop, publish, subscribe, and the callbacks paho makes — happens
on the `mqtt` thread this class starts.
Other threads talk to it only through the outbox (results, health, events), the command
queue (verified commands out) and `request_rebirth()` (a flag). Every paho callback contains
its own exceptions: a message that cannot be handled is quarantined (counted in
`stats.quarantined`, logged once per kind per minute), never raised into paho's loop.

Delivery: results leave the outbox only when the coordinator's `ack` covers their seq; a
broker PUBACK only frees the in-flight slot in paho. An ack is believed only when it is for
this outbox's stream, starts (`from`) at or below the lowest seq still held, and does not go
beyond the highest seq this process has sent; anything else is refused, counted and reported
as an event (a spoofed ack must not delete results the coordinator never stored). Unacked
results are re-sent after `ack_timeout_s` without ack progress (doubling up to 8x while nothing
moves) and after every reconnect. Health and events are removed on PUBACK (the latest N are
kept while offline).

With `result_per_message`, each result is also published alone on `.../result/each` (QoS 1,
not retained) by its own cursor over the outbox, independent of acks (so it flows without a
coordinator): every result appended while this process runs, once, in seq order, including
those held while the broker was away; not those of an earlier process, and not again after a
reconnect (a message paho had not yet written when a connection dropped is lost). The batched
`result` topic stays the one the coordinator stores and acks. Home Assistant discovery
(runtime/telemetry/homeassistant.py), when given, is published after every birth.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from runtime.config.telemetry import TelemetryConfig
from runtime.telemetry.homeassistant import Discovery
from runtime.telemetry.outbox import Outbox
from runtime.wire import clock as wire_clock
from runtime.wire import commands, payloads, safejson
from runtime.wire.events import EventType
from runtime.wire.mqtt import Connection
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.mqtt")

def device_id(cfg: TelemetryConfig) -> str:
    """The configured device id, or the host name made topic-safe."""
    if cfg.device:
        return cfg.device
    name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())
    return name[:64] or "device"


@dataclass
class PublisherStats:
    """Counters reported in health."""

    connected: bool = False
    connects: int = 0
    published_results: int = 0
    resends: int = 0
    acked_seq: int = 0
    commands_ok: int = 0
    commands_refused: int = 0
    quarantined: int = 0  # inbound messages refused: malformed, invalid, or failing to handle
    acks_refused: int = 0  # acks for another stream, from above our floor, or beyond our sends
    takeovers: int = 0  # the broker closed our session for another client with our id
    protocol: str = ""
    client_id: str = ""
    last_error: str = ""


class Publisher:
    """Runs the MQTT connection of one device (see module docstring)."""

    def __init__(self, cfg: TelemetryConfig, outbox: Outbox,
                 birth: Callable[[], dict[str, Any]] | None = None,
                 command_queue: queue.Queue | None = None, state_dir: Path | None = None,
                 homeassistant: Discovery | None = None, session_expiry_s: int = 0,
                 precheck: Callable[[commands.Command], str | None] | None = None,
                 clock: wire_clock.Clock | None = None):
        self.cfg = cfg
        # whether the wall clock can be believed when judging a command's expiry
        # (commands.time_problem; docs/clocks.md); one of its own when none is given
        self.clock = clock or wire_clock.Clock()
        # Asked before a command is accepted: a reason to answer `rejected` (a model name or
        # version this device does not have), or None. Runs on the MQTT thread: cheap checks.
        self.precheck = precheck
        self.outbox = outbox
        self.device = device_id(cfg)
        self.commands: queue.Queue = command_queue or queue.Queue(maxsize=100)
        self._stats = PublisherStats()
        self._birth = birth or (lambda: {})
        try:
            self._trusted = commands.load_public_keys(cfg.trusted_keys)
        except ValueError as e:
            raise ValueError(f"telemetry.trusted_keys: {e}") from e
        key_dir = state_dir if state_dir is not None else outbox.path.parent
        try:  # signs every command reply, so the coordinator can tell ours from forgeries
            self._key = commands.device_key(cfg.device_key, Path(key_dir) / "device.key")
        except (OSError, ValueError) as e:
            raise ValueError(f"telemetry.device_key: {e}") from e
        # Per-boot client id: a restarted daemon never collides with its own old session
        # (whose will the broker publishes in its own time), and a collision means someone
        # else took our id, which the connection reports as a takeover.
        self._stats.client_id = f"edgerun-{cfg.fleet}-{self.device}-{outbox.boot[:8]}"
        self._rlog = RateLimitedLog(log)
        self._event_last: dict[str, float] = {}
        self._max_sent = 0  # highest result seq handed to paho by this process (any connection)
        self._topic = {k: payloads.topic(cfg.fleet, self.device, k) for k in payloads.KINDS}
        self._rebirth = threading.Event()
        self._refusals = _Bucket(rate_hz=10, burst=20)  # replies to refused commands
        self._reset_cursors()
        self._ha = homeassistant
        # result_per_message: the highest seq published alone (results of earlier processes
        # are not: their consumers had them, or they are history by now)
        self._each_upto = outbox.last_seq() if cfg.result_per_message else 0
        self._each_changes = -1
        # session_expiry_s > 0 (a device that sleeps): a persistent session (clean start off,
        # the broker keeps it that long), so commands sent while it sleeps wait at the broker.
        self.session_expiry_s = session_expiry_s
        # signed lifetimes are capped, and the replay record with them (runtime/wire/commands.py)
        self.max_ttl_s = commands.lifetime_cap(cfg.max_command_ttl_s, session_expiry_s)
        outbox.bound_command_memory(commands.memory_bound(self.max_ttl_s, cfg.clock_skew_s))
        self._asleep: dict | None = None  # the retained state announced before a sleep
        self._slept_connects = (0, 0)  # connects, takeovers of the connections before a sleep
        self._conn = self._connection()
        # new rows go out now, not at the connection's next idle tick (the connection is
        # replaced after a sleep: looked up at each change)
        outbox.listen(lambda: self._conn.wake())

    def _connection(self) -> Connection:
        return Connection(
            self.cfg.broker, self._stats.client_id, name="mqtt",
            subscriptions=[(self._topic["cmd"], 1), (self._topic["ack"], 1)],
            on_message=self._on_message, on_connected=self._on_connected, on_tick=self._drain,
            on_publish=self._on_publish, on_error=self._callback_failed, will=self._will,
            on_refused=self._on_refused,
            on_takeover=lambda why: self._event(EventType.MQTT_TAKEOVER, "critical", why,
                                                client_id=self._stats.client_id),
            clean=self.session_expiry_s == 0, session_expiry_s=self.session_expiry_s,
            max_inflight=100)  # our own window (cfg.inflight) bounds results

    @property
    def stats(self) -> PublisherStats:
        """A snapshot of the counters, with the connection's own."""
        c = self._conn.stats
        return replace(self._stats, connected=self._conn.connected.is_set(),
                       connects=c.connects + self._slept_connects[0],
                       takeovers=c.takeovers + self._slept_connects[1], protocol=c.protocol,
                       last_error=c.last_error or self._stats.last_error)

    def _reset_cursors(self) -> None:
        self._sent_upto = 0  # highest result seq handed to paho on this connection
        self._acked = 0  # highest seq the coordinator acked
        self._last_progress = time.monotonic()
        self._timeout_scale = 1
        self._other_cursor = 0  # highest health/event id handed to paho
        self._other_mids: dict[int, int] = {}  # paho mid -> outbox id, awaiting PUBACK
        self._seen_changes = -1  # outbox.changes when it was last drained to the end

    # -- public API (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        """Start the MQTT thread (it connects in the background and keeps reconnecting)."""
        self._conn.start()

    def health(self) -> dict[str, Any]:
        """The `mqtt` section of the device's health (every field typed in the schema)."""
        s = asdict(self.stats)
        s.pop("last_error")
        return s

    def request_rebirth(self) -> None:
        """Re-publish the retained birth (e.g. after the model or choice changed)."""
        self._rebirth.set()
        self._conn.wake()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish the offline state, disconnect cleanly and join the thread."""
        self._conn.stop(timeout_s, farewell=self._farewell)

    def alive(self) -> bool:
        """The MQTT thread is running."""
        return self._conn.alive()

    def sleep(self, wake_at: float, reason: str, timeout_s: float = 5.0) -> None:
        """Before a suspend: publish the retained state `asleep until wake_at` (wall clock)
        and disconnect cleanly, so the broker publishes no will and keeps the session."""
        self._asleep = {"v": payloads.VERSION, "online": False, "asleep": True,
                        "wake_at": round(wake_at, 3), "boot": self.outbox.boot,
                        "t": time.time(), "reason": reason[:4000]}
        self._conn.stop(timeout_s, farewell=self._farewell)

    def wake(self) -> None:
        """After a resume: connect again (the same client id: the session and what the
        broker queued for it come back) and publish the birth."""
        self._asleep = None
        c = self._conn.stats
        self._slept_connects = (self._slept_connects[0] + c.connects,
                                self._slept_connects[1] + c.takeovers)
        self._conn = self._connection()
        self._conn.start()

    @property
    def session_ready(self) -> bool:
        """Connected and subscribed: what the broker queued for us during a sleep has
        arrived (it sends the queue right after CONNACK, before our SUBACK)."""
        return self._conn.subscribed.is_set()

    # -- on the MQTT thread (Connection callbacks) ---------------------------------------------

    def _will(self) -> tuple[str, bytes]:
        will = {"v": payloads.VERSION, "online": False, "boot": self.outbox.boot,
                "t": time.time(), "reason": "connection lost"}
        return self._topic["state"], payloads.encode("state", will)

    def _on_connected(self, client: mqtt.Client) -> None:
        self._reset_cursors()
        self._publish_birth(client)
        if self._ha is not None:
            self._ha.on_connected()
            self._ha.publish(client)
        log.info("connected to %s:%d (MQTT %s) as %s/%s", self.cfg.broker.host,
                 self.cfg.broker.port, self._conn.stats.protocol, self.cfg.fleet, self.device)

    def _farewell(self, client: mqtt.Client) -> mqtt.MQTTMessageInfo:
        offline = self._asleep or {"v": payloads.VERSION, "online": False,
                                   "boot": self.outbox.boot, "t": time.time(),
                                   "reason": "clean shutdown"}
        return client.publish(self._topic["state"], payloads.encode("state", offline), qos=1,
                              retain=True)

    def _publish_birth(self, client: mqtt.Client) -> None:
        status, r = self.clock.now()  # a synced birth gives the coordinator the offset
        # a lost replay record's moment, by the first reading (docs/clocks.md)
        self.outbox.sidecar.settle_not_before(status.synced, r.wall, r.boot_id, r.boottime)
        birth = {"v": payloads.VERSION, "online": True, "boot": self.outbox.boot, "t": r.wall,
                 "clk": wire_clock.stamp(status, r), "stream": self.outbox.stream,
                 **self._birth()}
        client.publish(self._topic["state"], payloads.encode("state", birth), qos=1, retain=True)

    def _drain(self, client: mqtt.Client) -> None:
        if self._rebirth.is_set():
            self._rebirth.clear()
            self._publish_birth(client)
            if self._ha is not None:  # a new model may bring new labels
                self._ha.publish(client)
        if self.cfg.result_per_message:
            self._publish_each(client)
        now = time.monotonic()
        if self._sent_upto > self._acked and (
                now - self._last_progress > self.cfg.ack_timeout_s * self._timeout_scale):
            self._stats.resends += self._sent_upto - self._acked
            self._sent_upto = self._acked  # re-send everything not yet acked
            self._last_progress = now
            self._timeout_scale = min(8, self._timeout_scale * 2)
            self._seen_changes = -1
        changes = self.outbox.changes
        if changes == self._seen_changes:
            return  # nothing new since the outbox was last drained (saves 100 queries/s)
        floor = None
        drained = False
        while self._sent_upto - self._acked < self.cfg.inflight:
            room = self.cfg.inflight - (self._sent_upto - self._acked)
            batch = self.outbox.pending(self._sent_upto, min(self.cfg.batch_max, room))
            if not batch:
                drained = True
                break
            floor = floor or self.outbox.floor()
            head = (f'{{"v":{payloads.VERSION},"stream":"{self.outbox.stream}",'
                    f'"boot":"{self.outbox.boot}","floor":{floor},"results":[')
            body = (head + ",".join(p.json for p in batch) + "]}").encode()
            info = client.publish(self._topic["result"], body, qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise ConnectionError(mqtt.error_string(info.rc))
            if self._sent_upto == self._acked:
                self._last_progress = now  # the ack clock starts with the first unacked send
            self._sent_upto = batch[-1].seq
            self._max_sent = max(self._max_sent, self._sent_upto)
            self._stats.published_results += len(batch)
        others = self.outbox.others(64)
        for rowid, kind, body in others:
            if rowid <= self._other_cursor:
                continue
            self._check_own(kind, body)
            info = client.publish(self._topic[kind], body.encode(), qos=1)
            self._other_mids[info.mid] = rowid
            self._other_cursor = rowid
        if drained and len(others) < 64:
            self._seen_changes = changes

    def _publish_each(self, client: mqtt.Client, limit: int = 200) -> None:
        """Publish results appended since the last call, one message each (see module
        docstring); runs before the batches, so it is never behind what acks delete."""
        changes = self.outbox.changes
        if changes == self._each_changes:
            return
        batch = self.outbox.pending(self._each_upto, limit)
        head = f'{{"v":{payloads.VERSION},"stream":"{self.outbox.stream}",'
        for p in batch:
            info = client.publish(self._topic["result/each"], (head + p.json[1:]).encode(), qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise ConnectionError(mqtt.error_string(info.rc))
            self._each_upto = p.seq
        if len(batch) < limit:  # drained: wait for the outbox to change
            self._each_changes = changes

    def _check_own(self, kind: str, body: str) -> None:
        """Our own health/event failing its schema is a bug the coordinator would quarantine
        silently from here: say so in this log (once a minute), then send it anyway."""
        try:
            payloads.check(kind, safejson.loads(body))
        except (payloads.PayloadError, safejson.JsonRejected) as e:
            self._rlog.log(f"own-{kind}", "this device's own %s does not match its schema (%s); "
                           "the coordinator will quarantine it: declare the field in "
                           "runtime/wire/payloads.py", kind, e, level=logging.ERROR)

    def _on_publish(self, mid: int) -> None:
        if self._ha is not None:
            self._ha.acked(mid)
        rowid = self._other_mids.pop(mid, None)
        if rowid is not None:
            self.outbox.remove([rowid])

    def _on_refused(self, mid: int, reason: str) -> None:
        """MQTT 5 told us the broker did not take a message (3.1.1 brokers drop it silently).
        Said once a minute per kind, with what to do: it is nearly always the ACL."""
        what = self._ha.refused(mid) if self._ha is not None else None
        if what:
            self._rlog.log("refused-ha", "the broker refused %s (%s): the device's broker "
                           "identity may not publish Home Assistant discovery; enrol it with "
                           "`edgerun fleet enroll --homeassistant` (docs/homeassistant.md)",
                           what, reason, level=logging.ERROR)
        else:
            self._rlog.log("refused", "the broker refused a message (%s); if it is the ACL, "
                           "regenerate it with `edgerun fleet enroll` (an ACL from an older "
                           "version lacks newer topics such as result/each)", reason,
                           level=logging.ERROR)

    def _on_message(self, client: mqtt.Client, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == self._topic["ack"]:
            self._on_ack(msg.payload)
        elif msg.topic == self._topic["cmd"]:
            self._on_command(client, msg.payload)
        else:
            self._quarantine("topic", f"a message on {msg.topic[:200]!r}, which we never "
                             "subscribed to")

    def _callback_failed(self, what: str, reason: str) -> None:
        if what == "message":  # handling an inbound message failed: that message is refused
            self._quarantine("message", reason)
        else:
            self._rlog.log(what, "MQTT %s callback failed: %s", what, reason[:300])

    def _quarantine(self, kind: str, reason: str) -> None:
        """Count a refused inbound message and log it (once per kind per minute)."""
        self._stats.quarantined += 1
        self._rlog.log(kind, "quarantined a %s message: %s", kind, reason[:300])

    def _event(self, type_: EventType, severity: str, text: str, **fields: Any) -> None:
        """An event for the operator (outbox -> coordinator), at most one per type a minute."""
        now = time.monotonic()
        if now - self._event_last.get(type_, -1e18) < 60:
            return
        self._event_last[type_] = now
        log.warning("%s", text)
        with contextlib.suppress(Exception):  # the outbox failing is not this message's fault
            status, r = self.clock.now()
            self.outbox.put("event", {"v": payloads.VERSION, "t": r.wall, "type": type_,
                                      "severity": severity, "detail": text, **fields,
                                      "clk": wire_clock.stamp(status, r)})

    def _on_ack(self, raw: bytes) -> None:
        try:
            ack = payloads.decode("ack", raw)
        except payloads.PayloadError as e:
            self._quarantine("ack", str(e))
            return
        if ack["stream"] == self.outbox.stream and ack["seq"] <= self._acked:
            return  # a late or repeated ack: nothing new
        why, suspicious = None, True
        if ack["stream"] != self.outbox.stream:
            # Also what a wiped outbox sees for its previous stream: counted, not an event.
            why, suspicious = (f"for stream {ack['stream']!r}, ours is "
                               f"{self.outbox.stream!r}"), False
        elif ack["seq"] > self._max_sent:
            # Acks for what an earlier process sent arrive after a restart: counted; an ack
            # beyond anything ever appended can only be forged.
            why = f"for seq {ack['seq']}, beyond the highest we sent ({self._max_sent})"
            suspicious = ack["seq"] > self.outbox.last_seq()
        elif ack["from"] > self.outbox.floor():
            # The coordinator vouches for [from, seq]; we would delete everything <= seq.
            why = (f"covering only seq {ack['from']}..{ack['seq']}, but we still hold "
                   f"seq {self.outbox.floor()}")
        if why is not None:
            self._stats.acks_refused += 1
            self._quarantine("ack", f"refused an ack {why}")
            if suspicious:
                self._event(EventType.ACK_REFUSED, "warning", f"refused an ack {why}; nothing was "
                            "deleted", stream=ack["stream"], seq=ack["seq"])
            return
        self._seen_changes = -1  # the window opened: look at the outbox again
        self.outbox.ack(ack["seq"])
        self._acked = ack["seq"]
        self._sent_upto = max(self._sent_upto, self._acked)
        self._last_progress = time.monotonic()
        self._timeout_scale = 1
        self._stats.acked_seq = self._acked

    def _on_command(self, client: mqtt.Client, raw: bytes) -> None:
        cmd_id = None
        try:
            env = payloads.decode("cmd", raw, max_bytes=self.cfg.max_command_bytes)
            cmd_id = env["id"]
            cmd = self._verify(env)
        except (payloads.PayloadError, commands.CommandRefused) as e:
            if isinstance(e, payloads.PayloadError):
                self._quarantine("cmd", str(e))
                cmd_id = cmd_id or _peek_id(raw)
            self._stats.commands_refused += 1
            self._rlog.log("cmd-refused", "refused a command (id %s): %s", cmd_id, e)
            if self._refusals.take():  # a flood of bad commands is not answered in kind
                self._reply(client, cmd_id, False, "refused", str(e))
            return
        self._stats.commands_ok += 1
        if cmd.name == "ping":
            self._reply(client, cmd.id, True, "done", "pong", {"t": time.time()})
        elif cmd.name == "rebirth":
            self._publish_birth(client)
            self._reply(client, cmd.id, True, "done", "birth re-published")
        else:
            try:
                why = self.precheck(cmd) if self.precheck else None
            except Exception as e:  # a bug in a check must cost this command only
                why = f"could not check the command: {type(e).__name__}: {e}"
            if why:
                log.warning("rejected command %s %s (id %s): %s", cmd.name,
                            commands.loggable(cmd.args), cmd.id, why)
                self._reply(client, cmd.id, False, "rejected", why)
                return
            try:
                self.commands.put_nowait(cmd)
            except queue.Full:
                self._reply(client, cmd.id, False, "refused", "busy: command queue full")
                return
            log.info("accepted command %s %s (id %s)", cmd.name, commands.loggable(cmd.args),
                     cmd.id)
            self._reply(client, cmd.id, True, "accepted", f"{cmd.name} queued")

    def _verify(self, env: dict[str, Any]) -> commands.Command:
        """commands.verify with the clock's state: while it is not synced, expiry is judged
        against the latest time known to have passed (the replay record's floor, raised by
        each verified command's issue time), never against the unsynced wall clock."""
        status, r = self.clock.now()
        side, skew = self.outbox.sidecar, self.cfg.clock_skew_s
        side.settle_not_before(status.synced, r.wall, r.boot_id, r.boottime)
        if side.pending is not None:
            raise commands.CommandRefused(
                "this device lost its command replay record while its clock is not synced; "
                "commands are refused until the clock syncs (then send it again)")
        floor_now = side.floor.now(r.boot_id, r.boottime)
        if commands.floor_wrong(r.wall, status.synced, floor_now, skew):
            side.lower_floor(r.wall, r.boot_id, r.boottime)
            floor_now = side.floor.now(r.boot_id, r.boottime)
        at = commands.judged_now(r.wall, status.synced, floor_now, skew)

        def remember(cid: str, expires: float) -> bool:
            # every check but the id's passed: the coordinator signed this issue time, and
            # while this clock is unknown the coordinator's is the authority (its commands'
            # expiry is on its clock); the floor is written with the id
            known, by = commands.floor_source(status.synced, at, env["issued_at"])
            side.raise_floor(known, r.boot_id, r.boottime, by=by)
            return side.remember(cid, expires, at, status.synced)

        return commands.verify(env, self.device, self._trusted, r.wall, skew, remember,
                               self.outbox.commands_not_before, self.max_ttl_s,
                               synced=status.synced, floor_now=floor_now)

    def _reply(self, client: mqtt.Client, cmd_id: str | None, ok: bool, status: str,
               reason: str, data: Any = None) -> None:
        reply = {"v": payloads.VERSION, "id": cmd_id, "ok": ok, "status": status,
                 "reason": reason[:4000], "t": time.time(), "device": self.device}
        if data is not None:
            reply["data"] = data
        reply = commands.sign_reply(self._key, reply)
        client.publish(self._topic["cmd/reply"], payloads.encode("cmd/reply", reply), qos=1)


class _Bucket:
    """Token bucket: `take()` is True at most `burst` times at once, `rate_hz` on average."""

    def __init__(self, rate_hz: float, burst: int):
        self.rate_hz, self.burst = rate_hz, burst
        self._tokens, self._t = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate_hz)
        self._t = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def _peek_id(raw: bytes) -> str | None:
    """The `id` of an invalid command when one can be read, so the reply can name it."""
    try:
        value = safejson.loads(raw, max_bytes=64 << 10).get("id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and len(value) <= 64 else None
