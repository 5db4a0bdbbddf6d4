"""The HTTP server under the coordinator's API and the device's local /metrics and /healthz:
uvicorn (its pure-Python h11 protocol) running a small ASGI app (runtime/wire/httpapp.py) on a
thread of its own, with the deadlines uvicorn lacks.

Why uvicorn + h11: a maintained server whose parser (h11) is strict, small and pure Python;
an event loop, so a slow or idle socket costs a few KB of memory instead of a thread (the
threaded standard-library server let 80 slow sockets hold all 64 of its slots).
uvicorn's own `timeout_keep_alive` only covers idle time between requests and is reset by
every byte, so a client trickling a request would hold its connection for ever (the same is
true of aiohttp's keepalive_timeout, and neither has a request-receipt deadline); uvicorn
takes a protocol class (`Config(http=...)`), so the deadlines are added there, by subclassing
its H11Protocol (`GuardedH11Protocol`):

- a request (line, headers and body) must arrive within `request_s` of the connection opening
  or of the previous response ending, plus the time its Content-Length needs at
  `min_body_bps`; no byte for `idle_s` closes the connection too (`timeout_keep_alive` is the
  same `idle_s` between requests);
- at most `per_client` connections from one address and `max_connections` in all: past
  either, a new connection is closed at once (a flood costs its own sockets, not the others');
- responses stalled by a client that does not read are the app's to bound (httpapp.py).

Slow sockets are cut silently (a close, no response: nothing to parse for a client that never
finished its request), and logged once a minute with a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn import Config
from uvicorn import Server as Uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("edgerun.http")


@dataclass
class Limits:
    """The deadlines and connection limits of one server (see the module docstring)."""

    request_s: float = 30.0  # request line + headers + a small body, from connect or last reply
    idle_s: float = 10.0  # no byte for this long: closed (also between keep-alive requests)
    min_body_bps: float = 64 * 1024  # a body of N bytes gets request_s + N / this
    max_connections: int = 1024
    per_client: int = 64
    # counts, read by tests and logs (one event loop thread writes them)
    open_by_client: dict[str, int] = field(default_factory=dict)
    cut_slow: int = 0
    refused_busy: int = 0
    malformed: int = 0  # requests h11 refused (answered 400)
    _said: float = 0.0

    def say(self, what: str, peer: str) -> None:
        """Log a cut or refused connection, at most once a minute (a flood is many)."""
        now = time.monotonic()
        if now - self._said >= 60:
            self._said = now
            log.warning("HTTP: %s (from %s; %d slow connections cut, %d refused over the "
                        "limits so far; logged once a minute)", what, peer, self.cut_slow,
                        self.refused_busy)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a request-receipt deadline and connection limits; the
    `limits` of one server are set on a subclass of it (`guarded_protocol`): uvicorn makes a
    protocol instance from the class it is given, with its own arguments."""

    limits: Limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._guard: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._last, self._in_body, self._counted = time.monotonic(), False, False
        super().connection_made(transport)
        peer = self.client[0] if self.client else "?"
        self._peer = peer
        total = sum(self.limits.open_by_client.values())
        if total >= self.limits.max_connections or \
                self.limits.open_by_client.get(peer, 0) >= self.limits.per_client:
            self.limits.refused_busy += 1
            self.limits.say(f"closed a connection over the limits ({self.limits.per_client} "
                            f"per client, {self.limits.max_connections} in all)", peer)
            transport.close()
            return
        self.limits.open_by_client[peer] = self.limits.open_by_client.get(peer, 0) + 1
        self._counted = True
        self._expect_request()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            left = self.limits.open_by_client.get(self._peer, 1) - 1
            if left > 0:
                self.limits.open_by_client[self._peer] = left
            else:
                self.limits.open_by_client.pop(self._peer, None)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last = time.monotonic()
        super().data_received(data)
        if self._deadline is None or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and not self._in_body:
            self._begin_body()
        elif state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._deadline = None  # received in full: the app answers in its own time
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._expect_request()

    def send_400_response(self, msg: str) -> None:
        # h11 refused the request (a malformed Content-Length, header line...): the same
        # JSON error body as every other refusal of the API
        self.limits.malformed += 1
        body = b'{"error": "malformed HTTP request: ' + msg.encode("ascii", "replace") \
            + b'"}'
        event = h11.Response(status_code=400, reason=b"Bad Request", headers=[
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"connection", b"close")])
        with contextlib.suppress(h11.LocalProtocolError):
            self.transport.write(self.conn.send(event))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()

    # -- the deadline -------------------------------------------------------------------

    def _expect_request(self) -> None:
        """Start the deadline of the next request: at connect, after each response. A
        pipelined request already in whole (uvicorn handled it) has no deadline."""
        now = time.monotonic()
        self._last = now
        self._disarm()
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._deadline = None
            return
        self._deadline = now + self.limits.request_s
        self._in_body = False
        if self.conn.their_state is h11.SEND_BODY:
            self._begin_body()
        self._arm(now)

    def _begin_body(self) -> None:
        self._in_body = True  # headers are in: the body gets time by its length
        length = dict(self.headers or []).get(b"content-length", b"0")
        with contextlib.suppress(ValueError):
            self._deadline += min(int(length), 1 << 40) / self.limits.min_body_bps  # type: ignore[operator]

    def _arm(self, now: float) -> None:
        self._disarm()
        if self._deadline is None:
            return
        at = min(self._deadline, self._last + self.limits.idle_s)
        self._guard = self.loop.call_later(max(0.0, at - now), self._check)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _check(self) -> None:
        self._guard = None
        if self._deadline is None or self.transport.is_closing():
            return
        now = time.monotonic()
        if now >= self._deadline or now - self._last >= self.limits.idle_s:
            self.limits.cut_slow += 1
            self.limits.say("closed a slow or idle connection (request not received in "
                            "time)", self._peer)
            self._deadline = None
            self.transport.close()
            return
        self._arm(now)


def guarded_protocol(limits: Limits) -> type[H11Protocol]:
    """The protocol class of one server: GuardedH11Protocol bound to its `limits`."""
    return type("Guarded", (GuardedH11Protocol,), {"limits": limits})


class Server:
    """One app served by uvicorn on its own thread and event loop. The socket is bound here, so
    a port in use raises OSError in the caller (not an exit inside uvicorn)."""

    def __init__(self, app: Any, host: str, port: int, limits: Limits, name: str = "http"):
        self.limits = limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(1024)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.server_address = self.sock.getsockname()
        config = Config(app, http=guarded_protocol(limits), lifespan="off", log_config=None,
                        access_log=False, server_header=False, date_header=True,
                        timeout_keep_alive=max(1, round(limits.idle_s)),
                        timeout_graceful_shutdown=2, backlog=1024, ws="none")
        # uvicorn logs each malformed request as a warning: a flood would fill the log; ours
        # are counted (Limits.malformed). An operator's own level for it is kept.
        quiet = logging.getLogger("uvicorn.error")
        if quiet.level == logging.NOTSET:
            quiet.setLevel(logging.ERROR)
        self._app = app
        self._uvicorn = Uvicorn(config)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self.sock]))
        except Exception:  # the server's own failure: say so; the process decides
            log.exception("the HTTP server on %s stopped", self.server_address)

    def shutdown(self) -> None:
        """Stop serving: close the socket, end open connections, wait (a few seconds)."""
        self._uvicorn.should_exit = True
        self._thread.join(10)
        with contextlib.suppress(OSError):
            self.sock.close()
        if callable(close := getattr(self._app, "close", None)):
            close()  # the app's thread pool

    def server_close(self) -> None:
        """Close the listening socket (shutdown does; kept for the old server's callers)."""
        with contextlib.suppress(OSError):
            self.sock.close()
