"""Bundle download over MQTT, for a device that reaches the broker but not the coordinator's
HTTP API (docs/ota.md, "Bundles over MQTT"). The device side; the wire format both sides share is
runtime/wire/bundle_chunks.py (the coordinator side is runtime/coordinator/bundle_chunks.py).

Topics (per device, granted by the broker ACL to that device only):

    edgerun/v1/<fleet>/<device>/bundle/req     device -> coordinator, JSON (QoS 1)
        {"v": 1, "bundle": "name@version", "offset": N, "length": L, "token": "..."}
    edgerun/v1/<fleet>/<device>/bundle/chunk   coordinator -> device, binary (QoS 1)
        a fixed 28-byte header (`HEADER`, big-endian), the bundle id, then the body:
        magic "ERBC", format 1, status, id length, offset, the bundle's total size, body length;
        status 0: the body is bytes [offset, offset + body length) of the bundle (at most
        what was asked, possibly less), else the body is the reason (UTF-8).

The device keeps `window` requests of `chunk` bytes outstanding, re-requests one that is not
answered within `timeout_s`, and appends to the same `<sha256>.edgerun.part` file as the HTTP
download, strictly in order (chunks that arrive early wait in memory: at most window x chunk
bytes), so the part is always a prefix of the bundle and an interrupted transfer — a dropped
link, a `kill -9`, a coordinator restart — resumes from its length, over either route. A
malformed, foreign or unexpected chunk costs that chunk. Nothing is trusted here: the size cap
and free-space check run before the first byte (runtime/ota/download.py), and the whole file's
sha256, then the bundle's signature and every file's hash (runtime/ota/bundle.py) judge the result.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from runtime.config.telemetry import BrokerConfig
from runtime.durable import crash_point
from runtime.ota.download import DownloadError, fetch
from runtime.wire.bundle_chunks import (
    CHUNK,
    FORBIDDEN,
    MAX_CHUNK,
    NOT_FOUND,
    OK,
    REQ,
    STATUS,
    decode_chunk,
    encode_request,
    nodelay,
    topic,
)

log = logging.getLogger("edgerun.ota")

class MqttTransfer:
    """The transport runtime.ota.download.fetch calls to append bytes `have..size` of one bundle
    to the part file, over MQTT (see module docstring). Opens its own connection for the
    transfer (bulk data never queues behind the device's results and command replies), with
    the device's broker login and a client id of its own."""

    def __init__(self, broker: BrokerConfig, fleet: str, device: str, bundle: str, token: str,
                 chunk: int = 128 * 1024, window: int = 8, timeout_s: float = 10.0,
                 check_stop: Callable[[], None] = lambda: None):
        self.broker, self.fleet, self.device = broker, fleet, device
        self.bundle, self.token = bundle, token
        self.chunk = max(1024, min(chunk, MAX_CHUNK))
        self.window, self.timeout_s = max(1, window), timeout_s
        self.stall_s = 4 * timeout_s  # no byte written for this long: give up (resumable)
        self.check_stop = check_stop  # raises to end the transfer (the daemon stopping)
        self._inbox: queue.Queue = queue.Queue(maxsize=4 * self.window + 16)
        self.stats: collections.Counter = collections.Counter()
        self.refused = ""  # the broker refused a request (its reason)

    def __call__(self, part: Path, have: int, size: int) -> None:
        from runtime.wire.brokerauth import for_connection
        from runtime.wire.mqtt import Connection

        conn = Connection(  # its own broker identity: client ids are bound to usernames
            for_connection(self.broker, "bundles"),
            f"edgerun-{self.fleet}-{self.device}-bundle-{secrets.token_hex(3)}",
            name="bundle-mqtt", subscriptions=[(topic(self.fleet, self.device, CHUNK), 1)],
            on_message=self._on_message, on_connected=nodelay, on_refused=self._on_refused,
            clean=True, max_inflight=max(20, 2 * self.window))
        conn.start()
        try:
            self._run(conn, part, have, size)
        finally:
            conn.stop(2.0)

    def _on_message(self, client: object, msg: object) -> None:
        # paho's thread: hand over, never block (a full inbox costs that chunk: re-requested)
        try:
            self._inbox.put_nowait(msg.payload)  # type: ignore[attr-defined]
        except queue.Full:
            self.stats["inbox_full"] += 1

    def _on_refused(self, mid: int, reason: str) -> None:
        # MQTT 5 only: the broker's PUBACK says no (3.1.1 drops it silently: the stall ends it)
        self.refused = reason

    def _run(self, conn: object, part: Path, have: int, size: int) -> None:
        req_topic = topic(self.fleet, self.device, REQ)
        label = f"MQTT {self.bundle}"
        outstanding: dict[int, list] = {}  # offset -> [length, deadline (0: send now)]
        early: dict[int, bytes] = {}  # arrived ahead of `have`
        next_req = have
        first, t0 = have, time.monotonic()
        last_progress = t0
        last_error = ""
        refused_since = 0.0
        with part.open("ab") as out:
            while have < size:
                self.check_stop()
                if self.refused:
                    raise DownloadError(
                        f"{label}: the broker refused the chunk request ({self.refused}): its "
                        f"ACL must let this device publish on {req_topic} (an ACL file written "
                        "before bundles over MQTT lacks it: `edgerun fleet acl --broker-dir "
                        "DIR`, or the next `edgerun fleet enroll`, rewrites it; then reload "
                        "the broker; docs/security.md)")
                now = time.monotonic()
                if conn.subscribed.is_set():  # type: ignore[attr-defined]
                    # what waits unwritten counts against the window too: behind a lost
                    # head chunk, asking on would pull the whole bundle into memory
                    while len(outstanding) + len(early) < self.window and next_req < size:
                        n = min(self.chunk, size - next_req)
                        outstanding[next_req] = [n, 0.0]
                        next_req += n
                    for off, o in outstanding.items():
                        if o[1] <= now:
                            if o[1]:
                                self.stats["re_requests"] += 1
                            o[1] = now + self.timeout_s
                            conn.publish(req_topic, encode_request(  # type: ignore[attr-defined]
                                self.bundle, off, o[0], self.token))
                            self.stats["requests"] += 1
                try:
                    raw = self._inbox.get(timeout=0.05)
                except queue.Empty:
                    raw = None
                if raw is not None:
                    why = self._take(raw, size, outstanding, early)
                    if why:
                        last_error = why
                        if why.startswith("refused:") and have == first and not early:
                            # Every answer for timeout_s says not found / forbidden and no
                            # byte came: nobody holds it, say so now rather than after the
                            # stall. (With a share_group, a coordinator without the bundle
                            # answers "not found" while another that has it sends data: the
                            # refused request is asked again and may land on that one.)
                            refused_since = refused_since or time.monotonic()
                            if time.monotonic() - refused_since >= self.timeout_s:
                                raise DownloadError(f"{label}: {why[9:]}")
                while have in early:
                    data = early.pop(have)
                    try:
                        out.write(data)
                        out.flush()
                    except OSError as e:  # a full disk: the part stays a prefix (resumable)
                        raise DownloadError(
                            f"{label}: cannot write {part} after {have} of {size} bytes "
                            f"({e}); the next attempt resumes") from None
                    have += len(data)
                    last_progress = time.monotonic()
                    crash_point("download")  # tests: kill -9 mid-transfer
                if time.monotonic() - last_progress > self.stall_s:
                    out.flush()
                    if not conn.connected.is_set():  # type: ignore[attr-defined]
                        last_error = ("not connected to the broker: "
                                      f"{conn.stats.last_error or 'no answer'}")  # type: ignore

                    raise DownloadError(
                        f"{label}: nothing arrived for {self.stall_s:.0f} s after {have} of "
                        f"{size} bytes ({last_error or 'no answer from any coordinator'}); "
                        "the next attempt resumes")
            out.flush()
            os.fsync(out.fileno())
        took = time.monotonic() - t0
        got = have - first
        log.info("bundle %s: %d bytes over MQTT in %.1f s (%.2f MB/s), %d requests, "
                 "%d re-requests, %d chunks ignored", self.bundle, got, took,
                 got / took / 1e6 if took > 0 else 0.0, self.stats["requests"],
                 self.stats["re_requests"], self.stats["ignored"])

    def _take(self, raw: bytes, size: int, outstanding: dict[int, list],
              early: dict[int, bytes]) -> str:
        """File one chunk; returns why it was not used ("" when it was). Anything wrong with
        it costs this chunk only: its request stays outstanding and is asked again."""
        try:
            c = decode_chunk(raw)
        except ValueError as e:
            self.stats["ignored"] += 1
            return f"malformed chunk: {e}"
        if c.bundle != self.bundle:
            self.stats["ignored"] += 1  # a late answer of an earlier transfer, or junk
            return f"a chunk of {c.bundle[:80]!r}, not {self.bundle}"
        o = outstanding.get(c.offset)
        if c.status != OK:
            if o is not None:  # ask again soon, not at once: the coordinator may be busy
                o[1] = time.monotonic() + min(1.0, self.timeout_s)
            kind = "refused" if c.status in (NOT_FOUND, FORBIDDEN) else "error"
            return f"{kind}: coordinator answered {STATUS[c.status]}: {c.reason}"
        if c.total != size:
            self.stats["ignored"] += 1
            return (f"the coordinator holds {c.total} bytes of {self.bundle}, the deploy "
                    f"command says {size}")
        if o is None:
            self.stats["duplicates"] += 1  # answer to a request already answered
            return ""
        if not 0 < len(c.body) <= o[0]:
            self.stats["ignored"] += 1
            return f"a chunk of {len(c.body)} bytes at {c.offset}, {o[0]} were asked"
        del outstanding[c.offset]
        early[c.offset] = c.body
        if len(c.body) < o[0]:  # the coordinator sends less than asked: ask for the rest
            outstanding[c.offset + len(c.body)] = [o[0] - len(c.body), 0.0]
        return ""


def fetch_over_mqtt(dest: Path, broker: BrokerConfig, fleet: str, device: str, bundle: str,
                    size: int, sha256: str, token: str, max_bytes: int, min_free_bytes: int,
                    chunk: int = 128 * 1024, window: int = 8, timeout_s: float = 10.0,
                    check_stop: Callable[[], None] = lambda: None) -> Path:
    """Download bundle `bundle` (`size` bytes, `sha256`) to `dest` over MQTT, resuming
    `dest.part` (whichever route wrote it); the same checks as the HTTP download."""
    transfer = MqttTransfer(broker, fleet, device, bundle, token, chunk, window, timeout_s,
                            check_stop)
    return fetch(f"MQTT {bundle}", dest, size, max_bytes=max_bytes,
                 min_free_bytes=min_free_bytes, sha256=sha256, via=transfer)


__all__ = ["MqttTransfer", "fetch_over_mqtt"]
