"""The coordinator's side of bundles over MQTT: answer devices' chunk requests from the shelf.

A device that cannot reach the HTTP API asks for its bundle in pieces on its own
`edgerun/v1/<fleet>/<device>/bundle/req` topic; this answers each request on
`.../<device>/bundle/chunk` (wire format: runtime/wire/bundle_chunks.py). It runs its own MQTT
connection (client id `<client_id>-bundles`, clean session: an unanswered request is simply
asked again), so megabytes of chunks never delay the acks and commands of the main one. With
`share_group` the request topic is a shared subscription: one coordinator of the group
answers each request (the shelf is in the shared store, so each holds every bundle; one that
cannot read it answers "not found" and the device asks again, maybe landing on another).

Requests are hostile until checked: the device is the one in the topic (the broker's ACL lets
a device publish only on its own), the JSON is size-limited, the bundle id, offset and length
are validated, the token must be the bundle's download token (the one in the signed `deploy`
command: it opens that bundle only, as over HTTP), a length over MAX_CHUNK is served short.
A bad request is answered with an error status and the reason. Work is bounded per device:
at most PER_DEVICE requests wait per device (more are dropped and counted), devices are
served round-robin by one thread, and at most MAX_UNACKED chunks are in flight to the broker
(QoS 1, released by its PUBACKs), so a flood from one device neither grows memory nor starves
the others.
"""

from __future__ import annotations

import collections
import hmac
import logging
import threading
import time
from typing import Any

from runtime.config.telemetry import check_name
from runtime.coordinator.bundles import BundleRefused, Shelf, check_id
from runtime.wire import safejson
from runtime.wire.brokerauth import for_connection
from runtime.wire.bundle_chunks import (
    BAD_RANGE,
    BAD_REQUEST,
    CHUNK,
    FORBIDDEN,
    MAX_CHUNK,
    MAX_REQUEST,
    NOT_FOUND,
    OK,
    REQ,
    encode_chunk,
    nodelay,
    topic,
)
from runtime.wire.payloads import MAX_PACKET
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.coordinator.bundles")

PER_DEVICE = 16  # requests waiting per device (a device's window is a few)
MAX_WAITING = 4096  # requests waiting in all
MAX_UNACKED = 16  # chunks published and not yet PUBACKed by the broker (4 MiB at most)


def read_range(shelf: Shelf, bundle_id: str, offset: int, length: int) -> tuple[int, bytes]:
    """(the bundle's size, up to `length` bytes of it from `offset`): the one place chunks
    are read from the shelf (its read API: `get`, `read`). BundleRefused when it is not held
    (404), the offset is outside it (416) or its rows are damaged (500)."""
    held = shelf.get(bundle_id)
    if held is None:
        raise BundleRefused(f"no bundle {bundle_id} held by this coordinator", 404)
    return held.size, shelf.read(held, offset, length)


class ChunkServer:
    """See module docstring. `start`/`stop` with the coordinator."""

    def __init__(self, fleet: str, shelf: Shelf, broker: Any, client_id: str,
                 share_group: str = ""):
        from runtime.wire.mqtt import Connection

        self.fleet, self.shelf = fleet, shelf
        base = f"edgerun/v1/{fleet}/+/{REQ}"
        self.filter = f"$share/{share_group}/{base}" if share_group else base
        self.counters: collections.Counter = collections.Counter()
        self._rlog = RateLimitedLog(log)
        self._cv = threading.Condition()
        self._waiting: dict[str, collections.deque] = {}  # device -> raw requests
        self._n = 0  # requests waiting in all
        self._unacked = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # its own broker identity (<username>+bundles): client ids are bound to usernames
        self._conn = Connection(for_connection(broker, "bundles"), f"{client_id}-bundles",
                                name="bundle-chunks",
                                subscriptions=[(self.filter, 1)], on_message=self._on_message,
                                on_connected=self._on_connected, on_publish=self._on_publish,
                                on_refused=self._on_refused, clean=True,
                                max_inflight=MAX_UNACKED, max_packet_bytes=MAX_PACKET)

    def start(self) -> None:
        """Connect and start serving."""
        self._conn.start()
        self._thread = threading.Thread(target=self._loop, name="bundle-chunks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and disconnect."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(5)
        self._conn.stop(2.0)

    def alive(self) -> bool:
        """Both threads run (the serving thread and its connection)."""
        return bool(self._thread and self._thread.is_alive() and self._conn.alive())

    def stats(self) -> dict[str, Any]:
        """Counters: requests, chunks and bytes sent, errors by kind, dropped floods."""
        return {**self.counters, "waiting": self._n}

    # -- the connection's thread ---------------------------------------------------------------

    def _on_connected(self, client: Any) -> None:
        nodelay(client)
        with self._cv:  # what was in flight on a dropped connection is gone: devices re-ask
            self._unacked = 0
            self._cv.notify_all()

    def _on_publish(self, mid: int) -> None:
        with self._cv:
            self._unacked = max(0, self._unacked - 1)
            self._cv.notify_all()

    def _on_refused(self, mid: int, reason: str) -> None:
        self.counters["refused_by_broker"] += 1
        self._rlog.log("broker-refused", "the broker refuses our bundle chunks (%s): its ACL "
                       "must let this coordinator publish on edgerun/v1/%s/+/%s (an ACL file "
                       "written before bundles over MQTT lacks it: `edgerun fleet acl "
                       "--broker-dir DIR` rewrites it, then reload the broker)", reason,
                       self.fleet, CHUNK, level=logging.ERROR)

    def _on_message(self, client: Any, msg: Any) -> None:
        parts = msg.topic.split("/")
        if len(parts) != 6 or parts[2] != self.fleet or check_name("device", parts[3]):
            self.counters["bad_topic"] += 1
            return
        device = parts[3]
        with self._cv:
            q = self._waiting.setdefault(device, collections.deque())
            if len(q) >= PER_DEVICE or self._n >= MAX_WAITING:
                self.counters["dropped_flood"] += 1  # the device re-asks after its timeout
                self._rlog.log(f"flood-{device}", "device %s: more than %d bundle chunk "
                               "requests waiting; dropping the rest", device, PER_DEVICE,
                               level=logging.WARNING)
                return
            q.append(bytes(msg.payload[:MAX_REQUEST + 1]))
            self._n += 1
            self._cv.notify()

    # -- the serving thread --------------------------------------------------------------------

    def _next(self) -> tuple[str, bytes] | None:
        """The next request, one device after another (round-robin)."""
        with self._cv:
            starved = 0.0
            while not self._stop.is_set():
                if self._n and self._unacked >= MAX_UNACKED:
                    # PUBACKs that never came without a reconnect (not seen with Mosquitto):
                    # start counting again rather than stop serving for good
                    starved = starved or time.monotonic()
                    if time.monotonic() - starved > 30:
                        self.counters["credit_resets"] += 1
                        self._unacked, starved = 0, 0.0
                if self._n and self._unacked < MAX_UNACKED:
                    device = next(d for d, q in self._waiting.items() if q)
                    q = self._waiting.pop(device)
                    raw = q.popleft()
                    self._n -= 1
                    if q:  # to the back of the line
                        self._waiting[device] = q
                    self._unacked += 1
                    return device, raw
                self._cv.wait(1.0)
        return None

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            device, raw = item
            try:
                body = self.answer(device, raw)
            except Exception as e:  # a bug costs this request, never the thread
                self.counters["internal_errors"] += 1
                log.exception("answering a bundle chunk request of %s failed", device)
                body = encode_chunk(BAD_REQUEST, "", 0, 0,
                                    f"internal error: {type(e).__name__}".encode())
            self._conn.publish(topic(self.fleet, device, CHUNK), body, qos=1)

    def answer(self, device: str, raw: bytes) -> bytes:
        """The `bundle/chunk` payload answering one request of `device` (data or an error
        with the reason; see module docstring)."""
        try:
            req = safejson.loads(raw, max_bytes=MAX_REQUEST, max_depth=2)
        except safejson.JsonRejected as e:
            return self._error(device, BAD_REQUEST, "", 0, 0, f"not a request: {e}")
        if not isinstance(req, dict):
            return self._error(device, BAD_REQUEST, "", 0, 0, "not a request: not an object")
        bundle, offset = req.get("bundle"), req.get("offset")
        length, token = req.get("length"), req.get("token")
        if not isinstance(bundle, str):
            return self._error(device, BAD_REQUEST, "", 0, 0, "no bundle id")
        try:
            check_id(bundle)
        except BundleRefused as e:
            return self._error(device, BAD_REQUEST, "", 0, 0, str(e))
        at = offset if _count(offset) else 0
        if not (_count(offset) and _count(length) and length > 0):
            return self._error(device, BAD_REQUEST, bundle, at, 0,
                               f"offset and length must be integers >= 0 (length >= 1), "
                               f"got {str(offset)[:20]}, {str(length)[:20]}")
        held = self.shelf.get(bundle)
        # an unknown bundle and a wrong token get the same answer, as over HTTP (401 for
        # both): a device must not learn which bundles exist by asking with a bad token;
        # the log and the counters (refused_1 / refused_2) tell them apart for the operator
        unopened = (f"no bundle {bundle} held by this coordinator, or not for this token "
                    "(the deploy command's token is needed)")
        if held is None:
            return self._error(device, NOT_FOUND, bundle, at, 0, unopened,
                               f"no bundle {bundle} held by this coordinator")
        if not isinstance(token, str) or not hmac.compare_digest(
                token.encode(), held.token.encode()):
            return self._error(device, NOT_FOUND, bundle, at, 0, unopened,
                               f"the token does not open {bundle}", counted=FORBIDDEN)
        if offset >= held.size:
            return self._error(device, BAD_RANGE, bundle, at, held.size,
                               f"offset {offset} is past the end of {bundle} "
                               f"({held.size} bytes)")
        try:
            size, data = read_range(self.shelf, bundle, offset, min(length, MAX_CHUNK))
        except BundleRefused as e:
            # 404, or 500 (a row missing from the store): this bundle cannot be had here
            status = BAD_RANGE if e.status == 416 else NOT_FOUND
            return self._error(device, status, bundle, at, held.size,
                               f"cannot read {bundle}: {e}")
        if not data:
            return self._error(device, BAD_RANGE, bundle, at, size,
                               f"nothing at offset {offset} of {bundle}")
        self.counters["chunks"] += 1
        self.counters["bytes"] += len(data)
        return encode_chunk(OK, bundle, offset, size, data)

    def _error(self, device: str, status: int, bundle: str, offset: int, total: int,
               why: str, logged: str = "", counted: int | None = None) -> bytes:
        """An error answer saying `why` (the log says `logged` when given; counted under
        `counted` when given, else `status`)."""
        kind = status if counted is None else counted
        self.counters[f"refused_{kind}"] += 1
        self._rlog.log(f"refused-{device}-{kind}", "device %s: bundle chunk request "
                       "refused: %s", device, logged or why, level=logging.WARNING)
        return encode_chunk(status, bundle, offset, total, why[:300].encode())


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


__all__ = ["ChunkServer", "read_range"]
