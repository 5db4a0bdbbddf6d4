"""JSON HTTP API of the coordinator (standard library server; it is an operator tool, not a
public web service — bind it to localhost or put it behind the site's reverse proxy).

Every API request needs `Authorization: Bearer <token>`; the token is made at first start in
`coordinator.api_token_file` (default: `api-token` next to the store), mode 0600, and read by
`edgerun fleet` (`--token-file`). Requests are checked before anything is read or done:
idle or slow connections are closed after `coordinator.http_timeout_s`, bodies need an exact
Content-Length within 64 KiB, query parameters are validated (errors are 400 with
{"error": ...}).

GET  /api/v1/fleet                          every device: status, alerts, choice, counts
GET  /api/v1/devices/{id}                   one device: view, acks, recent events
GET  /api/v1/devices/{id}/results?cursor=STREAM:SEQ&limit=N
                                            results in (stream, seq) order after the cursor:
                                            {"results": [...], "next": cursor or null}
GET  /api/v1/devices/{id}/health?since=T&until=T&limit=N
                                            health history (reduced records, oldest first,
                                            thinned to N; T in seconds since the epoch):
                                            {"health": [...]}, for `edgerun report`
GET  /api/v1/devices/{id}/history?window_s=N one device's health timeline (dashboard.py)
GET  /api/v1/alerts                         active alerts, recent transitions, webhook stats
GET  /api/v1/stats                          ingest counters, health age p50/p99
GET  /metrics                               Prometheus text exposition (docs/metrics.md)
POST /api/v1/devices/{id}/commands          {"cmd": ..., "args": {...}, "wait_s": 10}
PUT  /api/v1/bundles                        upload a model bundle (body: the file, streamed)
GET  /api/v1/bundles                        bundles held (no download tokens)
DELETE /api/v1/bundles/{name@version}       remove a bundle (409 while a rollout or a device's
                                            desired state needs it)
GET  /api/v1/groups, POST /api/v1/groups     {"group": G, "devices": [...]}
GET  /api/v1/rollouts[/{id}], POST /api/v1/rollouts
                                            {"bundle": "name@version", "to": G|"all",
                                             "canary_pct": N}: a staged rollout
GET  /api/v1/bundles/{name@version}         download; Range: bytes=N- resumes (206; ETag is
                                            the sha256, If-Range honoured). Also
                                            accepts that bundle's own download token

The dashboard's static files (`/`, `/static/...`; docs/dashboard.md) are the only paths
served without the API token (a bundle download may use the bundle's own token instead): they
hold no fleet data, and the page asks for the token itself.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import re
import secrets
import socket
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import dashboard, metrics
from runtime.coordinator.bundles import BundleRefused, byte_range, check_id
from runtime.coordinator.dialect import is_url
from runtime.coordinator.service import Coordinator, UnknownDevice
from runtime.wire.httpserver import BoundedHTTPServer

log = logging.getLogger("edgerun.api")

MAX_BODY = 65536
MAX_LIMIT = 10_000
MAX_CONNECTIONS = 64  # concurrent connections; more are closed at once (each costs a thread)
_INT = re.compile(r"^[0-9]{1,18}$")  # no sign, no exponent, below 2^62
_RESULT_PARAMS = {"cursor", "limit"}


class BadRequest(ValueError):
    """A request the API refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def token_path(cfg: CoordinatorConfig) -> Path:
    """Where the API token lives: `api_token_file`, else `api-token` next to the store."""
    if cfg.api_token_file:
        return Path(cfg.api_token_file).expanduser()
    if is_url(cfg.store):  # a PostgreSQL store has no directory of its own
        return Path("~/.local/state/edgerun/api-token").expanduser()
    return Path(cfg.store).expanduser().parent / "api-token"


def ensure_token(path: Path) -> str:
    """The API token in `path`, made (random, mode 0600) when the file does not exist.
    A token file others can read is refused: anyone holding it can command the fleet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PermissionError(f"{path}: the API token file is mode {mode:o}; it must be "
                                  f"readable by its owner only (chmod 600 {path})") from None
        token = path.read_text().strip()
        if len(token) < 16:
            raise PermissionError(f"{path}: the API token is shorter than 16 characters; "
                                  "delete the file to have a new one made") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("made the API token %s (mode 0600); `edgerun fleet --token-file %s ...`",
             path, path)
    return token


def parse_int(name: str, text: str, lo: int, hi: int) -> int:
    """A decimal integer in [lo, hi]; anything else (sign, exponent, huge) is a BadRequest."""
    if not _INT.match(text) or not lo <= int(text) <= hi:
        raise BadRequest(f"{name} must be an integer in [{lo}, {hi}], got {text[:40]!r}")
    return int(text)


def parse_cursor(text: str) -> tuple[str, int]:
    """`STREAM:SEQ` -> (stream, seq)."""
    stream, sep, seq = text.rpartition(":")
    if not sep or not stream or len(stream) > 128:
        raise BadRequest(f"cursor must be STREAM:SEQ as returned in `next`, got {text[:40]!r}")
    return stream, parse_int("cursor seq", seq, 0, 2**62 - 1)


def result_query(query: str) -> tuple[tuple[str, int] | None, int]:
    """Validated (cursor, limit) of a results request."""
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    unknown = set(names) - _RESULT_PARAMS
    if unknown:
        hint = " (`after` is gone: page with the `next` cursor)" if "after" in unknown else ""
        raise BadRequest(f"unknown query parameter(s) {sorted(unknown)}{hint}")
    if len(names) != len(set(names)):
        raise BadRequest("a query parameter is repeated")
    params = dict(pairs)
    cursor = parse_cursor(params["cursor"]) if "cursor" in params else None
    limit = parse_int("limit", params["limit"], 1, MAX_LIMIT) if "limit" in params else 1000
    return cursor, limit


def health_query(query: str, now: float | None = None) -> tuple[float, float, int]:
    """Validated (since, until, limit) of a health history request (whole seconds since the
    epoch; since defaults to a day before now, until to now, limit to 5000)."""
    import time

    now = time.time() if now is None else now
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    if unknown := set(names) - {"since", "until", "limit"}:
        raise BadRequest(f"unknown query parameter(s) {sorted(unknown)}")
    if len(names) != len(set(names)):
        raise BadRequest("a query parameter is repeated")
    params = dict(pairs)
    since = parse_int("since", params["since"], 0, 10**10) if "since" in params else now - 86400
    until = parse_int("until", params["until"], 0, 10**10) if "until" in params else now
    limit = parse_int("limit", params["limit"], 1, 20_000) if "limit" in params else 5000
    return float(since), float(until), limit



def serve(coordinator: Coordinator, host: str, port: int, token: str | None = None,
          timeout_s: float | None = None) -> ThreadingHTTPServer:
    """Start the API on a daemon thread; returns the server (`.server_address` has the port).
    `token` None = the one in the token file (made at first start)."""
    token = token if token is not None else ensure_token(token_path(coordinator.cfg))
    expected = f"Bearer {token}".encode()
    registry = metrics.registry(coordinator)

    class Handler(BaseHTTPRequestHandler):
        # StreamRequestHandler applies this to the socket: a connection idle (or trickling)
        # this long is closed instead of holding its thread.
        timeout = timeout_s if timeout_s is not None else coordinator.cfg.http_timeout_s
        protocol_version = "HTTP/1.1"

        def handle_one_request(self) -> None:
            # `timeout` bounds each socket read; this bounds the whole request line + headers
            # + body, so a client trickling a byte at a time cannot hold the thread either.
            self._deadline = threading.Timer(self.timeout * 3, self._abort)
            self._deadline.daemon = True
            self._deadline.start()
            try:
                super().handle_one_request()
            finally:
                self._deadline.cancel()

        def _abort(self) -> None:
            log.info("closed an API connection from %s: request not received within %.0f s",
                     self.client_address[0], self.timeout * 3)
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, body: Any, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="edgerun"')
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            got = (self.headers.get("Authorization") or "").encode()
            if hmac.compare_digest(got, expected):
                return True
            self.close_connection = True
            self._send(401, {"error": "missing or wrong API token (Authorization: Bearer "
                                      "<token from the coordinator's api-token file>)"})
            return False

        def _body(self) -> bytes:
            """The request body, refused before reading unless its length is exact and small."""
            if self.headers.get("Transfer-Encoding"):
                raise BadRequest("Transfer-Encoding is not accepted; send a Content-Length", 411)
            values = self.headers.get_all("Content-Length") or []
            if not values:
                raise BadRequest("Content-Length is required", 411)
            if len(values) > 1 or not _INT.match(values[0].strip()):
                raise BadRequest(f"Content-Length must be one non-negative integer, got "
                                 f"{', '.join(values)[:40]!r}")
            length = int(values[0])
            if length > MAX_BODY:
                raise BadRequest(f"request body of {length} bytes is over {MAX_BODY}", 413)
            try:
                body = self.rfile.read(length)
            except (TimeoutError, OSError):
                raise BadRequest("request body not received in time", 408) from None
            if len(body) != length:
                raise BadRequest(f"request body ended after {len(body)} of {length} bytes")
            self._deadline.cancel()  # read in full: a command may now wait for its reply
            return body

        def do_GET(self) -> None:
            try:
                self._get()
            except Exception:  # a bug costs this request, never the server; the operator sees it
                log.exception("API request GET %s failed", self.path[:200])
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send(500, {"error": "internal error; see the coordinator's log"})

        def do_POST(self) -> None:
            try:
                self._post()
            except Exception:
                log.exception("API request POST %s failed", self.path[:200])
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send(500, {"error": "internal error; see the coordinator's log"})

        def _get(self) -> None:
            url = urlparse(self.path)
            page = dashboard.static_file(url.path)
            if page is not None:  # no data in these: served without the token
                self._deadline.cancel()
                return self._send(200, page[0], page[1], dashboard.SECURITY_HEADERS)
            parts = [p for p in url.path.split("/") if p]
            if parts[:3] == ["api", "v1", "bundles"] and len(parts) == 4:
                # a client may percent-encode the id (`fleet bundles rm` does: `+` of a
                # version is %2B); check_id then refuses anything but an id's characters
                return self._download(unquote(parts[3]))
            if not self._authorized():
                return
            self._deadline.cancel()
            try:
                if parts == ["metrics"]:
                    return self._send(200, metrics.exposition(registry), metrics.CONTENT_TYPE)
                if parts == ["api", "v1", "fleet"]:
                    return self._send(200, coordinator.fleet_view())
                if parts == ["api", "v1", "stats"]:
                    return self._send(200, coordinator.stats())
                if parts == ["api", "v1", "alerts"]:
                    return self._send(200, coordinator.alerts_view())
                if parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["history"]:
                    window = dashboard.history_window(url.query, coordinator.cfg.keep_health_s)
                    return self._send(200, dashboard.history(coordinator, parts[3], window))
                if parts == ["api", "v1", "bundles"]:
                    return self._send(200, [h.public() for h in coordinator.shelf.list()])
                if parts == ["api", "v1", "groups"]:
                    return self._send(200, coordinator.rollouts.groups())
                if parts == ["api", "v1", "rollouts"]:
                    return self._send(200, coordinator.rollouts.list())
                if parts[:3] == ["api", "v1", "rollouts"] and len(parts) == 4:
                    r = coordinator.rollouts.get(parts[3])
                    return self._send(200, r) if r else self._send(
                        404, {"error": f"no rollout {parts[3][:40]!r}"})
                if parts[:3] == ["api", "v1", "devices"] and len(parts) == 4:
                    return self._send(200, coordinator.device_view(parts[3]))
                if parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["health"]:
                    since, until, limit = health_query(url.query)
                    coordinator.device_view(parts[3])  # 404 for a device never seen
                    return self._send(200, {"health": coordinator.store.health_history(
                        parts[3], since, until, limit)})
                if parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["results"]:
                    cursor, limit = result_query(url.query)
                    rows, nxt = coordinator.store.results_page(parts[3], cursor, limit)
                    return self._send(200, {"results": rows,
                                            "next": None if nxt is None else f"{nxt[0]}:{nxt[1]}"})
            except UnknownDevice as e:
                return self._send(404, {"error": f"unknown device {e.args[0]!r}"})
            except BadRequest as e:
                return self._send(e.status, {"error": str(e)})
            except dashboard.HistoryQueryError as e:
                return self._send(400, {"error": str(e)})
            self._send(404, {"error": f"no such endpoint: {url.path}"})

        def _download(self, bundle_id: str) -> None:
            """A bundle, whole or from a byte range, for the API token or its own token."""
            self._deadline.cancel()  # a download may take longer than one request should
            try:
                held = coordinator.shelf.get(check_id(bundle_id))
            except BundleRefused:
                held = None
            got = (self.headers.get("Authorization") or "").encode()
            if held is None or not (hmac.compare_digest(got, expected) or hmac.compare_digest(
                    got, f"Bearer {held.token}".encode())):
                if held is None and hmac.compare_digest(got, expected):
                    return self._send(404, {"error": f"no bundle {bundle_id[:80]!r}"})
                return self._authorized()  # answers 401 (never says which bundles exist)
            etag = f'"{held.sha256}"'  # the bytes' own name: a resume checks it (If-Range)
            cond = self.headers.get("If-Range")
            try:
                # If-Range naming other bytes (the id deleted and uploaded again with other
                # contents): the whole bundle, not the rest of another file
                rng = byte_range(self.headers.get("Range") if cond in (None, etag) else None,
                                 held.size)
            except BundleRefused as e:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{held.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                log.info("bundle %s: %s", held.id, e)
                return
            first, last = rng or (0, held.size - 1)
            self.send_response(206 if rng else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(last - first + 1))
            if rng:
                self.send_header("Content-Range", f"bytes {first}-{last}/{held.size}")
            self.end_headers()
            # from the store's chunk rows, one row at a time (any coordinator on the store
            # serves any bundle); a row gone missing ends the response short: the device's
            # size and sha256 checks refuse it and it resumes or retries
            pos = first
            try:
                while pos <= last:
                    data = coordinator.shelf.read(held, pos, min(held.chunk -
                                                                 pos % held.chunk,
                                                                 last - pos + 1))
                    self.wfile.write(data)
                    pos += len(data)
            except BundleRefused as e:
                log.error("bundle %s: %s", held.id, e)
                self.close_connection = True

        def do_PUT(self) -> None:
            try:
                if not self._authorized():
                    return
                parts = [p for p in urlparse(self.path).path.split("/") if p]
                if parts != ["api", "v1", "bundles"]:
                    self.close_connection = True
                    return self._send(404, {"error": f"no such endpoint: {self.path}"})
                values = self.headers.get_all("Content-Length") or []
                if len(values) != 1 or not _INT.match(values[0].strip()):
                    self.close_connection = True
                    return self._send(411, {"error": "one Content-Length is required"})
                self._deadline.cancel()  # the socket timeout still bounds each read
                try:
                    held = coordinator.shelf.receive(self.rfile, int(values[0]))
                except BundleRefused as e:
                    self.close_connection = True
                    return self._send(e.status, {"error": str(e)})
                log.info("bundle %s received (%d bytes)", held.id, held.size)
                self._send(200, held.public())
            except Exception:
                log.exception("API request PUT %s failed", self.path[:200])
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send(500, {"error": "internal error; see the coordinator's log"})

        def do_DELETE(self) -> None:
            try:
                if not self._authorized():
                    return
                self._deadline.cancel()
                if (self.headers.get("Content-Length") or "0").strip() != "0" \
                        or self.headers.get("Transfer-Encoding"):
                    self.close_connection = True  # a body is not read: never parse it
                parts = [p for p in urlparse(self.path).path.split("/") if p]
                if parts[:3] != ["api", "v1", "bundles"] or len(parts) != 4:
                    return self._send(404, {"error": f"no such endpoint: {self.path[:200]}"})
                try:
                    done = coordinator.shelf.delete(unquote(parts[3]))  # as GET does
                except BundleRefused as e:
                    return self._send(e.status, {"error": str(e)})
                self._send(200, {"deleted": done["id"], "chunks": done["chunks"],
                                 "freed_bytes": done["bytes"]})
            except Exception:
                log.exception("API request DELETE %s failed", self.path[:200])
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send(500, {"error": "internal error; see the coordinator's log"})

        def _rollout_post(self, what: str, raw: bytes) -> None:
            """POST groups / rollouts (docs/ota.md)."""
            from runtime.config.telemetry import check_name

            try:
                req = json.loads(raw or b"{}")
                if not isinstance(req, dict):
                    raise ValueError("body must be a JSON object")
                if what == "groups":
                    group, devices = req.get("group"), req.get("devices")
                    if not isinstance(group, str) or check_name("group", group) \
                            or group == "all":
                        raise ValueError("group must be 1-64 of A-Z a-z 0-9 _ . - (not 'all')")
                    if not isinstance(devices, list) or not devices or len(devices) > 10_000 \
                            or any(not isinstance(d, str) or check_name("device", d)
                                   for d in devices):
                        raise ValueError("devices must be a non-empty list of device ids")
                    coordinator.rollouts.set_group(group, devices)
                    return self._send(200, coordinator.rollouts.groups())
                bundle, to, pct = req.get("bundle"), req.get("to"), req.get("canary_pct", 0)
                if not isinstance(bundle, str) or not isinstance(to, str):
                    raise ValueError('body must be {"bundle": "name@version", "to": GROUP|'
                                     '"all", "canary_pct": N}')
                if isinstance(pct, bool) or not isinstance(pct, int | float) \
                        or not 0 <= pct <= 100:
                    raise ValueError("canary_pct must be a number in [0, 100]")
                return self._send(200, coordinator.rollouts.start(bundle, to, float(pct)))
            except (ValueError, TypeError, RecursionError) as e:
                return self._send(400, {"error": str(e)[:300]})

        def _post(self) -> None:
            if not self._authorized():
                return
            parts = [p for p in urlparse(self.path).path.split("/") if p]
            try:
                raw = self._body()
            except BadRequest as e:
                self.close_connection = True  # the unread body must not be parsed as a request
                return self._send(e.status, {"error": str(e)})
            if parts in (["api", "v1", "groups"], ["api", "v1", "rollouts"]):
                return self._rollout_post(parts[2], raw)
            if not (parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["commands"]):
                return self._send(404, {"error": f"no such endpoint: {self.path}"})
            try:
                req = json.loads(raw or b"{}")
                if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                    return self._send(400, {"error": 'body must be {"cmd": NAME, "args": {...}}'})
                args, wait_s = req.get("args", {}), req.get("wait_s", 10)
                if not isinstance(args, dict):
                    return self._send(400, {"error": "args must be an object"})
                if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) \
                        or not 0 <= wait_s <= 300:
                    return self._send(400, {"error": "wait_s must be a number in [0, 300]"})
                reply = coordinator.send_command(parts[3], req["cmd"], args,
                                                 wait_s=float(wait_s))
            except UnknownDevice as e:
                return self._send(404, {"error": f"unknown device {e.args[0]!r}"})
            except PermissionError as e:
                return self._send(403, {"error": str(e)})
            except (ValueError, TypeError, RecursionError) as e:
                return self._send(400, {"error": str(e)[:200]})
            if reply is None:
                return self._send(504, {"error": "no reply from the device in time"})
            self._send(200, reply)

    server = BoundedHTTPServer((host, port), Handler, MAX_CONNECTIONS)
    if not coordinator.api_url:  # what `deploy` commands tell devices to download from
        coordinator.api_url = f"http://{host}:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
