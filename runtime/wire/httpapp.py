"""A small ASGI app: a table of routes whose handlers are plain (blocking) functions, run on a
bounded thread pool, so the coordinator's store queries and command waits never block the
event loop that keeps every other connection (runtime/wire/httpserver.py) moving.

A handler gets a Request (method, raw path split into segments, query, headers, the client's
address and a blocking `body` reader that pulls the request body from the event loop as it is
read, so a refused request is answered before its body is read) and returns a Response (a
status, bytes or a blocking iterator of chunks, headers, whether to close the connection).
The dispatch itself (which routes need which token, in which order checks are made) is the
caller's: `App(dispatch)` with `dispatch(request) -> Response`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("edgerun.http")

SLICE = 64 * 1024  # bytes of a long response handed to the transport at a time


class Body:
    """The request body as a blocking file-like reader (`read(n)`), fed from the event loop.
    Reads return short (b"") once the body ended or the client went away."""

    def __init__(self, receive: Callable[[], Any], loop: asyncio.AbstractEventLoop,
                 wait_s: float):
        self._receive, self._loop, self._wait_s = receive, loop, wait_s
        self._buf = bytearray()
        self._more = True
        self.disconnected = False

    def _pull(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._receive(), self._loop)
        try:  # the server cuts a slow body itself; this bounds a server that stopped
            msg = future.result(self._wait_s)
        except (TimeoutError, RuntimeError):
            future.cancel()
            msg = {"type": "http.disconnect"}
        if msg["type"] == "http.disconnect":
            self._more, self.disconnected = False, True
            return
        self._buf += msg.get("body", b"")
        self._more = bool(msg.get("more_body", False))

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is left for n < 0); fewer only at the end."""
        while self._more and (n < 0 or len(self._buf) < n):
            self._pull()
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


@dataclass
class Request:
    """One request as a handler sees it."""

    method: str
    target: str  # the raw request target (path and query), as sent: for messages
    path: str  # the raw path (percent-encoding kept)
    query: str
    headers: list[tuple[str, str]]  # lowercased names, in order
    client: str
    body: Body

    @property
    def parts(self) -> list[str]:
        """The path's non-empty segments, still percent-encoded."""
        return [p for p in self.path.split("/") if p]

    def header(self, name: str) -> str | None:
        """The first value of header `name`, or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def header_all(self, name: str) -> list[str]:
        """Every value of header `name`."""
        name = name.lower()
        return [v for k, v in self.headers if k == name]


@dataclass
class Response:
    """What a handler answers: `body` bytes, or `chunks` (a blocking iterator, with the
    Content-Length in `headers`) for a long body; `close` ends the connection after it."""

    status: int
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    chunks: Iterator[bytes] | None = None


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None,
                  close: bool = False) -> Response:
    """A JSON response (objects the json module cannot write are written with str())."""
    return Response(status, json.dumps(obj, default=str).encode(), "application/json",
                    dict(headers or {}), close)


class App:
    """ASGI 3 app: every HTTP request goes to `dispatch` on the thread pool."""

    def __init__(self, dispatch: Callable[[Request], Response], workers: int, stall_s: float,
                 name: str = "http"):
        self.dispatch = dispatch
        self.stall_s = stall_s  # a response the client does not read for this long: cut
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.name = name

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"").decode("latin-1")
        target = raw.decode("latin-1") + (f"?{query}" if query else "")
        req = Request(scope["method"], target, urlsplit(raw.decode("latin-1")).path, query,
                      [(k.decode("latin-1").lower(), v.decode("latin-1"))
                       for k, v in scope["headers"]],
                      (scope.get("client") or ("?", 0))[0], Body(receive, loop, self.stall_s))
        resp = await loop.run_in_executor(self.pool, self._safe, req)
        await self._send(resp, send, loop, req)

    def _safe(self, req: Request) -> Response:
        try:
            return self.dispatch(req)
        except Exception:  # a bug costs this request, never the server; the operator sees it
            log.exception("%s request %s %s failed", self.name, req.method, req.target[:200])
            return json_response(500, {"error": "internal error; see the log"}, close=True)

    async def _send(self, resp: Response, send: Callable, loop: asyncio.AbstractEventLoop,
                    req: Request) -> None:
        # names as HTTP writes them (h11 sends them as given; clients that keep the case,
        # like http.client's dict of headers, see what the old server sent)
        headers = []
        if resp.content_type:
            headers.append((b"Content-Type", resp.content_type.encode("latin-1")))
        for k, v in resp.headers.items():
            headers.append((k.encode("latin-1"), v.encode("latin-1")))
        if resp.chunks is None and "content-length" not in {k.lower() for k in resp.headers}:
            headers.append((b"Content-Length", str(len(resp.body)).encode()))
        if resp.status == 401:
            headers.append((b"WWW-Authenticate", b'Bearer realm="edgerun"'))
        if resp.close:
            headers.append((b"Connection", b"close"))
        try:
            await self._within(send({"type": "http.response.start", "status": resp.status,
                                     "headers": headers}))
            if resp.chunks is None:
                await self._within(send({"type": "http.response.body", "body": resp.body}))
                return
            end = object()
            while True:
                try:
                    chunk = await loop.run_in_executor(self.pool, next, resp.chunks, end)
                except Exception as e:  # the body's source failed: the response ends short
                    log.error("%s: %s %s: response cut short: %s", self.name, req.method,
                              req.target[:200], e)
                    return
                if chunk is end:
                    break
                # in slices: the stall bound is per 64 KiB the client takes, not per chunk
                # row (1 MiB would need 35 KB/s to pass a 30 s bound)
                for i in range(0, len(chunk), SLICE):
                    await self._within(send({"type": "http.response.body",
                                             "body": chunk[i:i + SLICE], "more_body": True}))
            await self._within(send({"type": "http.response.body", "body": b""}))
        except TimeoutError:
            log.info("%s: %s %s: the client did not read the response for %.0f s; "
                     "connection closed", self.name, req.method, req.target[:200],
                     self.stall_s)
        except OSError:  # the client went away mid-response
            pass

    async def _within(self, step: Any) -> None:
        await asyncio.wait_for(step, self.stall_s)

    def close(self) -> None:
        """Stop the pool (after the server stopped)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
