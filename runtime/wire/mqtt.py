"""Shared paho-mqtt plumbing: client construction from config, the protocol probe, and
`Connection`, the one connection thread every MQTT user runs (reconnecting on the shared
backoff, runtime/wire/backoff.py)."""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from runtime.config.telemetry import BrokerConfig
from runtime.wire import clock
from runtime.wire.backoff import Backoff

log = logging.getLogger("edgerun.mqtt")


class CredentialError(ValueError):
    """A credential file the broker config names (password_file, tls.*) cannot be used; the
    message names the key and the file."""


def _credentials(broker: BrokerConfig) -> str | None:
    """The password, after checking that every credential file named can be used: a
    missing CA file was `[Errno 2] No such file or directory` with no name, reported as
    the broker being unreachable."""
    password = None
    if broker.password_file:
        try:
            password = Path(broker.password_file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.filename else e  # names the path
            raise CredentialError(f"password_file {broker.password_file}: {why}") from e
    tls = broker.tls
    try:
        if tls.ca:
            what = f"tls.ca {tls.ca}"
            ssl.create_default_context().load_verify_locations(tls.ca)
        if tls.cert:
            what = f"tls.cert {tls.cert}" + (f" (tls.key {tls.key})" if tls.key else "")
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(tls.cert, tls.key or None)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise CredentialError(f"{what}: {e}") from e
    return password


def make_client(broker: BrokerConfig, client_id: str, protocol: str,
                clean: bool = True) -> mqtt.Client:
    """A paho 2.x client with TLS and credentials from `broker`; not yet connected.

    `protocol` is "5" or "3.1.1"; for 3.1.1 `clean` is the clean-session flag (for 5 it is
    passed at connect time as clean_start).
    """
    v5 = protocol == "5"
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else clean,
    )
    password = _credentials(broker)
    if broker.username:
        client.username_pw_set(broker.username, password)
    if broker.tls.ca or broker.tls.cert:
        client.tls_set(ca_certs=broker.tls.ca or None, certfile=broker.tls.cert or None,
                       keyfile=broker.tls.key or None)
    client.max_queued_messages_set(0)
    return client


def connect(client: mqtt.Client, broker: BrokerConfig, protocol: str, clean: bool = True,
            session_expiry_s: int = 0, max_packet_bytes: int = 0) -> None:
    """Open the TCP/TLS connection and send CONNECT (CONNACK arrives through the loop).
    `max_packet_bytes` (MQTT 5, 0 = none): the broker drops larger messages for this client
    rather than sending them (paho would read each whole into memory)."""
    if protocol == "5":
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        if session_expiry_s:
            props.SessionExpiryInterval = session_expiry_s
        if max_packet_bytes:
            props.MaximumPacketSize = max_packet_bytes
        client.connect(broker.host, broker.port, broker.keepalive_s, clean_start=clean,
                       properties=props)
    else:
        client.connect(broker.host, broker.port, broker.keepalive_s)


def clock_cause(e: BaseException) -> str | None:
    """The clock's part in a TLS failure (runtime/wire/clock.py tls_time_cause), read now;
    None when `e` is no certificate time failure or the clock is synced."""
    if not isinstance(e, ssl.SSLCertVerificationError):
        return None
    r = clock.read()
    return clock.tls_time_cause(e.verify_code, clock.judge(r), r.wall)


class ProtocolProbe:
    """MQTT 5 where the broker speaks it, 3.1.1 otherwise. A 3.1.1-only broker (the embedded
    demo one) refuses a v5 CONNECT, so until a connection has worked every failed attempt
    alternates the protocol; after that it sticks."""

    def __init__(self, configured: str):
        self.configured = self.current = configured
        self.worked = False

    def failed(self) -> None:
        """An attempt failed before CONNACK."""
        if not self.worked and self.configured == "5":
            self.current = "3.1.1" if self.current == "5" else "5"

    def succeeded(self) -> None:
        """CONNACK accepted: keep this protocol."""
        self.worked = True


_TAKEN_OVER = 142  # MQTT 5 DISCONNECT reason: another client connected with our client id


@dataclass
class ConnectionStats:
    """What a connection reports (health, stats)."""

    connects: int = 0
    takeovers: int = 0
    callback_errors: int = 0
    protocol: str = ""
    last_error: str = ""
    dropped_outgoing: int = 0  # queued while disconnected, dropped oldest-first over the cap


class Connection:
    """One MQTT connection owned by one thread: the publisher, the coordinator and the MQTT
    trigger source each run one.

    The thread connects (TLS/credentials from config, will (`will()` is asked at every
    attempt, so each connection may carry its own), MQTT 5 with a 3.1.1 fallback
    until a connection has worked), reconnects with capped jittered backoff, subscribes on
    every CONNACK, and between network loops publishes what other threads queued with
    `publish` and calls `on_tick` (paho is not thread-safe: every paho call happens here).
    It sleeps until the socket has something, another thread calls `wake` (`publish` does),
    or IDLE_TICK_S passes: a thread polling paho every 10 ms took the GIL 100 times a second
    (~0.1 ms each), and every frame that met one of those waited for it.
    Every callback contains its own exceptions: a failure is reported to `on_error(what,
    reason)` and costs that message, never the thread. A takeover — MQTT 5 says the session
    was handed to another client with our id; 3.1.1 only drops us, so 3 unexpected
    disconnects within 60 s count too — goes to `on_takeover(why)`.
    """

    def __init__(self, broker: BrokerConfig, client_id: str, *, name: str,
                 subscriptions: Sequence[tuple[str, int]] = (),
                 on_message: Callable[[mqtt.Client, mqtt.MQTTMessage], None] | None = None,
                 on_connected: Callable[[mqtt.Client], None] | None = None,
                 on_tick: Callable[[mqtt.Client], None] | None = None,
                 on_publish: Callable[[int], None] | None = None,
                 on_refused: Callable[[int, str], None] | None = None,
                 on_takeover: Callable[[str], None] | None = None,
                 on_error: Callable[[str, str], None] | None = None,
                 will: Callable[[], tuple[str, bytes]] | None = None,
                 clean: bool = True, session_expiry_s: int = 0, max_inflight: int = 100,
                 connect_timeout_s: float = 10.0, max_packet_bytes: int = 0,
                 will_retain: bool = True):
        self.broker, self.client_id, self.name = broker, client_id, name
        self.subscriptions = list(subscriptions)
        self._on_message, self._on_connected = on_message, on_connected
        self._on_tick, self._on_publish = on_tick, on_publish
        self._on_refused = on_refused  # MQTT 5: a PUBACK with a failure reason (e.g. the ACL)
        self._on_takeover, self._on_error = on_takeover, on_error
        self._will, self.clean, self.session_expiry_s = will, clean, session_expiry_s
        # the device's state will is retained; Sparkplug's NDEATH must not be (the spec)
        self.will_retain = will_retain
        self.max_inflight, self.connect_timeout_s = max_inflight, connect_timeout_s
        self.max_packet_bytes = max_packet_bytes  # MQTT 5: larger ones are never sent to us
        self.stats = ConnectionStats()
        self.clock_refusals = 0  # TLS refused on certificate time while the clock is unsynced
        self.connected = threading.Event()  # CONNACK accepted
        self.subscribed = threading.Event()  # SUBACK received: nothing published is missed
        self._proto = ProtocolProbe(broker.protocol)
        self._backoff = Backoff()
        self._stop = threading.Event()
        self._outgoing: queue.Queue = queue.Queue()
        self._said_dropped = False  # the drop warning, once per outage
        self._client: mqtt.Client | None = None
        self._thread: threading.Thread | None = None
        self._disconnects: collections.deque = collections.deque(maxlen=3)
        self._farewell: Callable[[mqtt.Client], Any] | None = None
        self._wake_r: socket.socket | None = None  # the thread's wake-up pair (start)
        self._wake_w: socket.socket | None = None

    # -- any thread -----------------------------------------------------------------------------

    def start(self) -> Connection:
        """Start the thread (it connects in the background and keeps reconnecting)."""
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """Have the thread look at its queue and call `on_tick` now, not at its next idle
        tick (any thread; e.g. the outbox has new rows). A wake-up before `start` or after
        the thread ended does nothing."""
        w = self._wake_w
        if w is not None:
            # a socket, not a raw fd: once closed, send raises instead of writing to
            # whatever file reused the number; a full buffer already means "wake"
            with contextlib.suppress(OSError):
                w.send(b"\0")

    MAX_OUTGOING = 10_000  # messages queued while the broker is away

    def publish(self, topic: str, body: bytes, qos: int = 1, retain: bool = False) -> None:
        """Queue a message; the connection's thread publishes it once connected. While the
        broker is away at most MAX_OUTGOING wait: beyond that the oldest is dropped (counted
        in `stats.dropped_outgoing`, said once per outage) so a long outage cannot grow the
        process without bound; what must survive one (results, a rollout's deploys) is kept
        and re-sent by its owner, not by this queue."""
        while not self.connected.is_set() and self._outgoing.qsize() >= self.MAX_OUTGOING:
            try:
                self._outgoing.get_nowait()
            except queue.Empty:
                break
            self.stats.dropped_outgoing += 1
            if not self._said_dropped:
                self._said_dropped = True
                log.warning("%s: the broker has been away for %d queued messages; dropping "
                            "the oldest (their owners re-send what must arrive)", self.name,
                            self.MAX_OUTGOING)
        self._outgoing.put((topic, body, qos, retain))
        self.wake()

    def stop(self, timeout_s: float = 5.0,
             farewell: Callable[[mqtt.Client], Any] | None = None) -> None:
        """Stop: `farewell(client)` may publish a last message (its MQTTMessageInfo is waited
        for up to 3 s), then disconnect cleanly and join the thread."""
        self._farewell = farewell
        self._stop.set()
        self.wake()
        if self._thread:
            self._thread.join(timeout_s + 4)

    def alive(self) -> bool:
        """The thread is running."""
        return self._thread is not None and self._thread.is_alive()

    # -- the connection's thread ----------------------------------------------------------------

    def _run(self) -> None:
        next_attempt = 0.0
        while not self._stop.is_set():
            try:
                if self._client is None:
                    if time.monotonic() < next_attempt:
                        self._stop.wait(0.05)
                        continue
                    if not self._try_connect():
                        next_attempt = time.monotonic() + self._backoff.next_delay()
                        continue
                client = self._client
                if not self.connected.is_set() and (
                        time.monotonic() - self._started > self.connect_timeout_s):
                    self._drop(f"no CONNACK within {self.connect_timeout_s:.0f} s")
                    next_attempt = time.monotonic() + self._backoff.next_delay()
                    continue
                rc = self._loop(client)
                if self._client is None:  # refused or dropped in a callback, which said why
                    next_attempt = time.monotonic() + self._backoff.next_delay()
                    continue
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    self._drop(f"network loop: {mqtt.error_string(rc)}")
                    next_attempt = time.monotonic() + self._backoff.next_delay()
                    continue
                if self.connected.is_set():
                    self._flush(client)
                    if self._on_tick:
                        self._on_tick(client)
            except ConnectionError as e:  # a publish found the link gone: the network
                log.warning("%s: %s; reconnecting", self.name, e)  # (no traceback)
                self._drop(f"{type(e).__name__}: {e}")
                next_attempt = time.monotonic() + self._backoff.next_delay()
            except Exception as e:  # a bug or a DB error must not end the connection for good
                log.exception("%s: %s; reconnecting", self.name, e)
                self._drop(f"{type(e).__name__}: {e}")
                next_attempt = time.monotonic() + self._backoff.next_delay()
        try:
            self._shutdown()
        finally:
            pair, self._wake_w, self._wake_r = (self._wake_w, self._wake_r), None, None
            for s in pair:  # taken away first: a late wake() finds None, not a closed socket
                if s is not None:
                    s.close()

    IDLE_TICK_S = 0.1  # longest the thread sleeps with nothing to do: on_tick's clocks (ack
    # timeouts) and the CONNACK deadline are checked at least this often

    def _loop(self, client: mqtt.Client) -> int:
        """One pass of paho's loop, after sleeping until the socket is readable (or writable,
        while paho has bytes to write: a full send buffer must not spin the thread), `wake`
        is called or IDLE_TICK_S passes; no sleep while TLS holds decrypted bytes a select
        cannot see."""
        sock, wake = client.socket(), self._wake_r
        if sock is None or wake is None:
            return client.loop(timeout=0.01)
        pending = getattr(sock, "pending", None)
        if not (pending is not None and pending() > 0):
            try:
                ready, _, _ = select.select([sock, wake], [sock] if client.want_write() else [],
                                            [], self.IDLE_TICK_S)
            except (OSError, ValueError):  # the socket closed under us: paho says so
                ready = []
            if wake in ready:
                with contextlib.suppress(OSError):
                    wake.recv(4096)
        return client.loop(timeout=0)

    def _try_connect(self) -> bool:
        b = self.broker
        try:
            client = make_client(b, self.client_id, self._proto.current, clean=self.clean)
            client.max_inflight_messages_set(self.max_inflight)
            if self._will:
                topic, body = self._will()
                client.will_set(topic, body, qos=1, retain=self.will_retain)
            client.on_connect = self._cb_connect
            client.on_disconnect = self._cb_disconnect
            client.on_message = self._cb_message
            client.on_publish = self._cb_publish
            client.on_subscribe = self._cb_subscribe
            connect(client, b, self._proto.current, clean=self.clean,
                    session_expiry_s=self.session_expiry_s,
                    max_packet_bytes=self.max_packet_bytes)
        except CredentialError as e:  # not the network: the operator fixes a file
            self.stats.last_error = f"broker credentials: {e}"
            if self._backoff.attempts % 10 == 0:
                log.error("%s: cannot use the broker's credentials: %s; retrying", self.name,
                          e)
            return False
        except (OSError, ValueError) as e:
            self.stats.last_error = f"connect to {b.host}:{b.port}: {e}"
            if (cause := clock_cause(e)) is not None:
                self.stats.last_error = f"connect to {b.host}:{b.port}: {cause}"
                self.clock_refusals += 1
                if self._backoff.attempts % 10 == 0:
                    log.error("%s: TLS to %s:%d refused: %s (%s)", self.name, b.host, b.port,
                              cause, e)
            elif self._backoff.attempts % 10 == 0:
                log.warning("%s: broker %s:%d unreachable (%s); retrying", self.name, b.host,
                            b.port, e)
            self._proto.failed()
            return False
        self._client = client
        self._started = time.monotonic()
        return True

    def _drop(self, why: str) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):  # already gone
                self._client.disconnect()
        was = self.connected.is_set()
        self._client = None
        self.connected.clear()
        self.subscribed.clear()
        self.stats.last_error = why
        if was:
            log.warning("%s: lost the broker (%s); reconnecting", self.name, why)
        else:
            self._proto.failed()

    def _flush(self, client: mqtt.Client) -> None:
        while True:
            try:
                topic, body, qos, retain = self._outgoing.get_nowait()
            except queue.Empty:
                return
            client.publish(topic, body, qos=qos, retain=retain)

    def _contain(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # never into paho's loop: a raise there ends the thread
            self.stats.callback_errors += 1
            if self._on_error:
                with contextlib.suppress(Exception):
                    self._on_error(what, f"{type(e).__name__}: {e}")
            else:
                log.warning("%s: %s callback failed: %s", self.name, what, e)

    def _cb_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self._contain("connect", self._connected, client, reason_code)

    def _connected(self, client: mqtt.Client, reason_code: Any) -> None:
        if reason_code.is_failure:
            log.error("%s: broker refused the connection: %s", self.name, reason_code)
            self._drop(f"broker refused connection: {reason_code}")
            return
        self.stats.connects += 1
        self._said_dropped = False
        self.stats.protocol = self._proto.current
        self._proto.succeeded()
        self._backoff.reset()
        self.connected.set()
        if self.subscriptions:
            client.subscribe(self.subscriptions)
        else:
            self.subscribed.set()
        if self._on_connected:
            self._on_connected(client)

    def _cb_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self.subscribed.set()

    def _cb_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._contain("disconnect", self._disconnected, client, reason_code,
                      getattr(flags, "is_disconnect_packet_from_server", True))

    def _disconnected(self, client: mqtt.Client, reason_code: Any,
                      from_broker: bool = True) -> None:
        if client is not self._client or not self.connected.is_set():
            return
        self.connected.clear()
        self.subscribed.clear()
        self._client = None
        if self._stop.is_set():
            return
        if from_broker:  # the broker's DISCONNECT says why (a session taken over, ...)
            log.warning("%s: disconnected from the broker (%s); reconnecting", self.name,
                        reason_code)
        else:  # paho names a closed socket "Unspecified error": say what is known
            log.warning("%s: the connection to the broker was lost (it closed without a "
                        "word: the broker stopped or restarted, or the network dropped); "
                        "reconnecting", self.name)
        now = time.monotonic()
        self._disconnects.append(now)
        taken = getattr(reason_code, "value", None) == _TAKEN_OVER
        flapping = len(self._disconnects) == 3 and now - self._disconnects[0] < 60
        if taken or flapping:
            self.stats.takeovers += 1
            self._disconnects.clear()
            why = ("the broker handed our session to another client with our client id"
                   if taken else "3 unexpected disconnects within 60 s")
            if self._on_takeover:
                self._on_takeover(f"{why} ({self.client_id}); another client may be using "
                                  "this identity")

    def _cb_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        if self._on_message:
            self._contain("message", self._on_message, client, msg)

    def _cb_publish(self, client, userdata, mid, reason_code, properties) -> None:
        if self._on_refused and getattr(reason_code, "is_failure", False):
            self._contain("publish", self._on_refused, mid, str(reason_code))
        if self._on_publish:
            self._contain("publish", self._on_publish, mid)

    def _shutdown(self) -> None:
        client = self._client
        if client is None or not self.connected.is_set():
            return
        with contextlib.suppress(Exception):
            self._flush(client)
            info = self._farewell(client) if self._farewell else None
            deadline = time.monotonic() + 3.0
            while info is not None and not info.is_published() and (
                    time.monotonic() < deadline):
                if client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                    break
            client.disconnect()
            # until the DISCONNECT is out and the socket closed (loop then reports no
            # connection): one pass may leave it queued behind other packets, and a socket
            # closed without it makes the broker publish the will ("connection lost")
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and client.loop(
                    timeout=0.05) == mqtt.MQTT_ERR_SUCCESS:
                pass
        self.connected.clear()
        self._client = None
