"""JSON HTTP API of the coordinator: the route table of runtime/coordinator/routes.py served by
uvicorn (runtime/wire/httpserver.py). An operator tool: bind it to localhost or put it behind
the site's reverse proxy; it holds up under slow clients anyway (deadlines, connection limits).

Every API request needs `Authorization: Bearer <token>`; the token is made at first start in
`coordinator.api_token_file` (default: `api-token` next to the store), mode 0600, and read by
`edgerun fleet` (`--token-file`). Requests are checked before anything is read or done: a
connection silent for `coordinator.http_timeout_s` is closed, a request must arrive whole
within 3 x `http_timeout_s` (a trickling client is cut too; a body gets time by its length),
at most MAX_PER_CLIENT connections per client address and MAX_CONNECTIONS in all; bodies need
an exact Content-Length within 64 KiB, query parameters are validated (errors are 400 with
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

import logging
import os
import secrets
import stat
from pathlib import Path

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.dialect import is_url
from runtime.coordinator.queries import (  # noqa: F401  (the API's names, as they were)
    INT,
    MAX_LIMIT,
    BadRequest,
    health_query,
    parse_cursor,
    parse_int,
    result_query,
)
from runtime.coordinator.service import Coordinator
from runtime.durable import make_dir
from runtime.wire.httpserver import Limits, Server

log = logging.getLogger("edgerun.api")

MAX_CONNECTIONS = 1024  # in all; more are closed at once (each costs a socket, not a thread)
MAX_PER_CLIENT = 64  # from one address: a flood from one client cannot take them all
WORKERS = 32  # handler threads (a command waiting for its reply holds one)


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
    if why := make_dir(path.parent):
        raise OSError(f"{path}: its directory {path.parent} {why}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.is_dir():  # was "mode 755 ... chmod 600", which would not have fixed it
            raise OSError(f"{path}: is a directory, not a file; remove it to have a token "
                          "made") from None
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PermissionError(f"{path}: the API token file is mode {mode:o}; it must be "
                                  f"readable by its owner only (chmod 600 {path})") from None
        try:
            token = path.read_text().strip()
        except UnicodeDecodeError:  # was a traceback
            raise OSError(f"{path}: is not text, so not a token this coordinator made; "
                          "delete the file to have a new one made") from None
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


def serve(coordinator: Coordinator, host: str, port: int, token: str | None = None,
          timeout_s: float | None = None) -> Server:
    """Start the API on a thread of its own; returns the server (`.server_address` has the
    port, `.shutdown()` stops it). `token` None = the one in the token file (made at first
    start). `timeout_s` (default `coordinator.http_timeout_s`): silence that closes a
    connection; a request must arrive within 3 x that."""
    from runtime.coordinator.routes import Api
    from runtime.wire.httpapp import App

    token = token if token is not None else ensure_token(token_path(coordinator.cfg))
    timeout = timeout_s if timeout_s is not None else coordinator.cfg.http_timeout_s
    app = App(Api(coordinator, token).dispatch, WORKERS, stall_s=timeout * 3, name="api")
    server = Server(app, host, port, Limits(request_s=timeout * 3, idle_s=timeout,
                                            max_connections=MAX_CONNECTIONS,
                                            per_client=MAX_PER_CLIENT), name="http")
    if not coordinator.api_url:  # what `deploy` commands tell devices to download from
        coordinator.api_url = f"http://{host}:{server.server_address[1]}"
    return server
