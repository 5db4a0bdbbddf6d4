"""The coordinator API's routes: a table of (method, path pattern) -> handler, and the order
of the checks every request passes (docs in runtime/coordinator/api.py, which serves this on
runtime/wire/httpserver.py).

Order, as it always was: the dashboard's static files and bundle downloads (which accept a
bundle's own token) come first; then the API token, for every other path, known or not (no
token: 401, never a 404 that tells which paths exist); then a POST's body, checked before it
is read (exact Content-Length within 64 KiB, no Transfer-Encoding); then the route, or 404.
Handlers are plain functions on the app's thread pool (runtime/wire/httpapp.py).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from runtime.coordinator import dashboard, metrics
from runtime.coordinator.bundles import BundleRefused, byte_range, check_id
from runtime.coordinator.queries import INT, BadRequest, health_query, result_query
from runtime.coordinator.service import Coordinator, UnknownDevice
from runtime.coordinator.store_open import unavailable
from runtime.wire import commands, safejson
from runtime.wire.httpapp import Request, Response, json_response
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.api")

MAX_BODY = 65536


@dataclass(frozen=True)
class Route:
    """`pattern`: the path's segments; "*" matches any one segment."""

    method: str
    pattern: tuple[str, ...]
    handler: str  # the Api method's name

    def matches(self, method: str, parts: list[str]) -> bool:
        """This route serves `method` on a path of these segments."""
        return method == self.method and len(parts) == len(self.pattern) and all(
            p == "*" or p == q for p, q in zip(self.pattern, parts, strict=True))


# Served after the API token check. GET errors: UnknownDevice 404, BadRequest its status.
ROUTES = (
    Route("GET", ("metrics",), "get_metrics"),
    Route("GET", ("api", "v1", "fleet"), "get_fleet"),
    Route("GET", ("api", "v1", "stats"), "get_stats"),
    Route("GET", ("api", "v1", "alerts"), "get_alerts"),
    Route("GET", ("api", "v1", "devices", "*", "history"), "get_history"),
    Route("GET", ("api", "v1", "bundles"), "get_bundles"),
    Route("GET", ("api", "v1", "groups"), "get_groups"),
    Route("GET", ("api", "v1", "rollouts"), "get_rollouts"),
    Route("GET", ("api", "v1", "rollouts", "*"), "get_rollout"),
    Route("GET", ("api", "v1", "devices", "*"), "get_device"),
    Route("GET", ("api", "v1", "devices", "*", "health"), "get_health"),
    Route("GET", ("api", "v1", "devices", "*", "results"), "get_results"),
    Route("POST", ("api", "v1", "groups"), "post_rollouts"),
    Route("POST", ("api", "v1", "rollouts"), "post_rollouts"),
    Route("POST", ("api", "v1", "devices", "*", "commands"), "post_command"),
    Route("PUT", ("api", "v1", "bundles"), "put_bundle"),
    Route("DELETE", ("api", "v1", "bundles", "*"), "delete_bundle"),
)
# Served before the token check: each decides itself (the static files hold no fleet data;
# a download takes the API token or that bundle's own token).
PUBLIC = (
    Route("GET", ("api", "v1", "bundles", "*"), "get_download"),
)
METHODS = ("GET", "POST", "PUT", "DELETE")


_store_unavailable = unavailable  # (store_open.unavailable)


def _error(status: int, message: str, close: bool = False) -> Response:
    return json_response(status, {"error": message}, close=close)


class Api:
    """The handlers, bound to one coordinator and its API token."""

    def __init__(self, coordinator: Coordinator, token: str):
        self.c = coordinator
        self.expected = f"Bearer {token}".encode()
        self.registry = metrics.registry(coordinator)
        self._rlog = RateLimitedLog(log)

    # -- dispatch ---------------------------------------------------------------------------

    def dispatch(self, req: Request) -> Response:
        """Answer one request (the order of checks: see the module docstring)."""
        if req.method not in METHODS:
            return _error(501, f"unsupported method {req.method[:20]!r}", close=True)
        parts = req.parts
        if req.method == "GET":
            page = dashboard.static_file(req.path)
            if page is not None:  # no data in these: served without the token
                return Response(200, page[0], page[1], dict(dashboard.SECURITY_HEADERS))
        for route in PUBLIC:
            if route.matches(req.method, parts):
                return getattr(self, route.handler)(req, parts)
        if not self.authorized(req):
            return self.unauthorized()
        if req.method == "POST":
            try:
                raw = self.small_body(req)
            except BadRequest as e:  # the unread body must not be parsed as a request
                return _error(e.status, str(e), close=True)
            req = _with_body(req, raw)
        if req.method == "DELETE" and ((req.header("Content-Length") or "0").strip() != "0"
                                       or req.header("Transfer-Encoding")):
            closing = True  # a body is not read: never parse it
        else:
            closing = False
        for route in ROUTES:
            if route.matches(req.method, parts):
                resp = self._guarded(route, req, parts)
                resp.close = resp.close or closing
                return resp
        where = req.path if req.method == "GET" else req.target[:200]
        return _error(404, f"no such endpoint: {where}", close=req.method == "PUT" or closing)

    def _guarded(self, route: Route, req: Request, parts: list[str]) -> Response:
        try:
            return getattr(self, route.handler)(req, parts)
        except commands.CommandRefused as e:  # what every device would refuse
            return _error(400, str(e)[:300])
        except UnknownDevice as e:
            return _error(404, f"unknown device {e.args[0]!r}")
        except BadRequest as e:
            return _error(e.status, str(e))
        except dashboard.HistoryQueryError as e:
            return _error(400, str(e))
        except Exception as e:
            if not _store_unavailable(e):
                raise
            # a store down (PostgreSQL stopped, a disk failing) answered 500 "internal
            # error" with a traceback a request: every scrape of /metrics added one
            why = f"the coordinator's store cannot be read now ({e}); try again later"
            self._rlog.log("store-read", "api request %s %s: %s", req.method,
                           req.target[:200], why, level=logging.ERROR)
            return _error(503, why[:500])

    def authorized(self, req: Request) -> bool:
        """The request carries the API token (constant-time comparison)."""
        got = (req.header("Authorization") or "").encode("latin-1")
        return hmac.compare_digest(got, self.expected)

    @staticmethod
    def unauthorized() -> Response:
        return _error(401, "missing or wrong API token (Authorization: Bearer <token from "
                           "the coordinator's api-token file>)", close=True)

    @staticmethod
    def small_body(req: Request) -> bytes:
        """The request body, refused before reading unless its length is exact and small."""
        if req.header("Transfer-Encoding"):
            raise BadRequest("Transfer-Encoding is not accepted; send a Content-Length", 411)
        values = req.header_all("Content-Length")
        if not values:
            raise BadRequest("Content-Length is required", 411)
        if len(values) > 1 or not INT.match(values[0].strip()):
            raise BadRequest(f"Content-Length must be one non-negative integer, got "
                             f"{', '.join(values)[:40]!r}")
        length = int(values[0])
        if length > MAX_BODY:
            raise BadRequest(f"request body of {length} bytes is over {MAX_BODY}", 413)
        body = req.body.read(length)
        if len(body) != length:
            if req.body.disconnected:
                raise BadRequest("request body not received in time", 408)
            raise BadRequest(f"request body ended after {len(body)} of {length} bytes")
        return body

    # -- GET --------------------------------------------------------------------------------

    def get_metrics(self, req: Request, parts: list[str]) -> Response:
        return Response(200, metrics.exposition(self.registry), metrics.CONTENT_TYPE)

    def get_fleet(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.fleet_view())

    def get_stats(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.stats())

    def get_alerts(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.alerts_view())

    def get_history(self, req: Request, parts: list[str]) -> Response:
        window = dashboard.history_window(req.query, self.c.cfg.keep_health_s)
        return json_response(200, dashboard.history(self.c, parts[3], window))

    def get_bundles(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, [h.public() for h in self.c.shelf.list()])

    def get_groups(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.rollouts.groups())

    def get_rollouts(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.rollouts.list())

    def get_rollout(self, req: Request, parts: list[str]) -> Response:
        r = self.c.rollouts.get(parts[3])
        return json_response(200, r) if r else _error(404, f"no rollout {parts[3][:40]!r}")

    def get_device(self, req: Request, parts: list[str]) -> Response:
        return json_response(200, self.c.device_view(parts[3]))

    def get_health(self, req: Request, parts: list[str]) -> Response:
        since, until, limit = health_query(req.query)
        self.c.device_view(parts[3])  # 404 for a device never seen
        return json_response(200, {"health": self.c.store.health_history(parts[3], since,
                                                                         until, limit)})

    def get_results(self, req: Request, parts: list[str]) -> Response:
        cursor, limit = result_query(req.query)
        rows, nxt = self.c.store.results_page(parts[3], cursor, limit)
        return json_response(200, {"results": rows,
                                   "next": None if nxt is None else f"{nxt[0]}:{nxt[1]}"})

    def get_download(self, req: Request, parts: list[str]) -> Response:
        """A bundle, whole or from a byte range, for the API token or its own token."""
        # a client may percent-encode the id (`fleet bundles rm` does: `+` of a version is
        # %2B); check_id then refuses anything but an id's characters
        bundle_id = unquote(parts[3])
        try:
            held = self.c.shelf.get(check_id(bundle_id))
        except BundleRefused:
            held = None
        got = (req.header("Authorization") or "").encode("latin-1")
        if held is None or not (hmac.compare_digest(got, self.expected) or hmac.compare_digest(
                got, f"Bearer {held.token}".encode())):
            if held is None and hmac.compare_digest(got, self.expected):
                return _error(404, f"no bundle {bundle_id[:80]!r}")
            return self.unauthorized()  # never says which bundles exist
        etag = f'"{held.sha256}"'  # the bytes' own name: a resume checks it (If-Range)
        cond = req.header("If-Range")
        try:
            # If-Range naming other bytes (the id deleted and uploaded again with other
            # contents): the whole bundle, not the rest of another file
            rng = byte_range(req.header("Range") if cond in (None, etag) else None, held.size)
        except BundleRefused as e:
            log.info("bundle %s: %s", held.id, e)
            return Response(416, b"", None, {"Content-Range": f"bytes */{held.size}",
                                             "Content-Length": "0"})
        first, last = rng or (0, held.size - 1)
        headers = {"Accept-Ranges": "bytes", "ETag": etag,
                   "Content-Length": str(last - first + 1)}
        if rng:
            headers["Content-Range"] = f"bytes {first}-{last}/{held.size}"
        return Response(206 if rng else 200, b"", "application/octet-stream", headers,
                        chunks=self._chunks(held, first, last))

    def _chunks(self, held: Any, first: int, last: int) -> Iterator[bytes]:
        """The bytes first..last from the store's chunk rows, one row at a time (any
        coordinator on the store serves any bundle); a row gone missing ends the response
        short: the device's size and sha256 checks refuse it and it resumes or retries."""
        pos = first
        while pos <= last:
            data = self.c.shelf.read(held, pos, min(held.chunk - pos % held.chunk,
                                                    last - pos + 1))
            if not data:
                raise BundleRefused(f"bundle {held.id}: no bytes at {pos}")
            yield data
            pos += len(data)

    # -- POST, PUT, DELETE ------------------------------------------------------------------

    def post_rollouts(self, req: Request, parts: list[str]) -> Response:
        """POST groups / rollouts (docs/ota.md)."""
        from runtime.config.telemetry import check_name

        what = parts[2]
        try:
            body = safejson.loads(req.body.read() or b"{}")  # as a device parses
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            if what == "groups":
                group, devices = body.get("group"), body.get("devices")
                if not isinstance(group, str) or check_name("group", group) or group == "all":
                    raise ValueError("group must be 1-64 of A-Z a-z 0-9 _ . - (not 'all')")
                if not isinstance(devices, list) or not devices or len(devices) > 10_000 \
                        or any(not isinstance(d, str) or check_name("device", d)
                               for d in devices):
                    raise ValueError("devices must be a non-empty list of device ids")
                self.c.rollouts.set_group(group, devices)
                return json_response(200, self.c.rollouts.groups())
            bundle, to, pct = body.get("bundle"), body.get("to"), body.get("canary_pct", 0)
            if not isinstance(bundle, str) or not isinstance(to, str):
                raise ValueError('body must be {"bundle": "name@version", "to": GROUP|'
                                 '"all", "canary_pct": N}')
            if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
                raise ValueError("canary_pct must be a number in [0, 100]")
            return json_response(200, self.c.rollouts.start(bundle, to, float(pct)))
        except (ValueError, TypeError, RecursionError) as e:
            return _error(400, str(e)[:300])

    def post_command(self, req: Request, parts: list[str]) -> Response:
        try:
            body = safejson.loads(req.body.read() or b"{}")  # as a device parses
            if not isinstance(body, dict) or not isinstance(body.get("cmd"), str):
                return _error(400, 'body must be {"cmd": NAME, "args": {...}}')
            args, wait_s = body.get("args", {}), body.get("wait_s", 10)
            if not isinstance(args, dict):
                return _error(400, "args must be an object")
            if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) \
                    or not 0 <= wait_s <= 300:
                return _error(400, "wait_s must be a number in [0, 300]")
            reply = self.c.send_command(parts[3], body["cmd"], args, wait_s=float(wait_s))
        except commands.CommandRefused as e:  # what every device would refuse
            return _error(400, str(e)[:300])
        except UnknownDevice as e:
            return _error(404, f"unknown device {e.args[0]!r}")
        except PermissionError as e:
            return _error(403, str(e))
        except (ValueError, TypeError, RecursionError) as e:
            return _error(400, str(e)[:200])
        if reply is None:
            return _error(504, self.c.no_reply(parts[3], body["cmd"], float(wait_s)))
        return json_response(200, reply)

    def put_bundle(self, req: Request, parts: list[str]) -> Response:
        values = req.header_all("Content-Length")
        if len(values) != 1 or not INT.match(values[0].strip()):
            return _error(411, "one Content-Length is required", close=True)
        try:
            held = self.c.shelf.receive(req.body, int(values[0]))
        except BundleRefused as e:
            return _error(e.status, str(e), close=True)
        log.info("bundle %s received (%d bytes)", held.id, held.size)
        return json_response(200, held.public())

    def delete_bundle(self, req: Request, parts: list[str]) -> Response:
        try:
            done = self.c.shelf.delete(unquote(parts[3]))  # as GET does
        except BundleRefused as e:
            return _error(e.status, str(e))
        return json_response(200, {"deleted": done["id"], "chunks": done["chunks"],
                                   "freed_bytes": done["bytes"]})


class _Read:
    """A body already read (POST): handlers read it again from here."""

    def __init__(self, data: bytes):
        self.data, self.disconnected = data, False

    def read(self, n: int = -1) -> bytes:
        out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return out


def _with_body(req: Request, raw: bytes) -> Request:
    from dataclasses import replace

    return replace(req, body=_Read(raw))  # type: ignore[arg-type]
