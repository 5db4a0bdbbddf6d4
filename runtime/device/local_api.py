"""An opt-in local HTTP endpoint on the device, for single-box users without a coordinator:

GET /metrics   the daemon's own health as Prometheus gauges (the same names as the
               coordinator's per-device series, runtime/wire/metrics.py, labelled with this device)
GET /healthz   200 {"status": "ok", ...} while the inference loop turns, 503 otherwise

Off by default (`[local_api] port = 0`). It has no authentication, so it binds 127.0.0.1
unless `host` says otherwise (a warning is logged then); it only reads, it never commands.
Requests are bounded: a few concurrent connections, a short socket timeout, GET only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from runtime.config.local_api import LocalApiConfig
from runtime.config.schema import ConfigError
from runtime.wire import metrics
from runtime.wire.httpserver import BoundedHTTPServer

log = logging.getLogger("edgerun.local_api")

MAX_CONNECTIONS = 8
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class HealthCollector:
    """Prometheus families from the daemon's health, read at scrape time."""

    def __init__(self, health: Callable[[], dict[str, Any]], alive: Callable[[], bool],
                 device: str):
        self.health, self.alive, self.device = health, alive, device

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not call the daemon."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Liveness, then every health gauge (runtime.wire.metrics)."""
        fam = GaugeMetricFamily("edgerun_device_alive", "1 while the inference loop turns",
                                labels=["device"])
        fam.add_metric([self.device], 1.0 if _alive(self.alive) else 0.0)
        yield fam
        yield from metrics.families([({"device": self.device}, read_health(self.health))],
                                    ("device",))


def _alive(alive: Callable[[], bool]) -> bool:
    try:
        return bool(alive())
    except Exception:  # a part not started yet, or a bug: not alive, and the scrape goes on
        return False


def read_health(health: Callable[[], dict[str, Any]], tries: int = 3) -> dict[str, Any] | None:
    """The daemon's health, or None when it cannot be made now. It is assembled from state
    the main loop changes, so a read that races a change is retried a couple of times."""
    for i in range(tries):
        try:
            return health()
        except Exception as e:
            if i == tries - 1:
                log.debug("health not available for the local API: %s: %s",
                          type(e).__name__, e)
            time.sleep(0.01)
    return None


class LocalApi:
    """The server: `start()` binds and serves on a daemon thread, `stop()` closes it."""

    def __init__(self, cfg: LocalApiConfig, health: Callable[[], dict[str, Any]],
                 alive: Callable[[], bool], device: str = ""):
        self.cfg = cfg
        self.health, self.alive = health, alive
        self.registry = CollectorRegistry()
        self.registry.register(HealthCollector(health, alive, device))
        ProcessCollector(registry=self.registry)
        self.server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        """The bound port once started, else 0."""
        return self.server.server_address[1] if self.server else 0

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of /healthz."""
        alive = _alive(self.alive)
        body: dict[str, Any] = {"status": "ok" if alive else "stalled", "alive": alive}
        h = read_health(self.health)
        if h is None:
            body["health"] = "not available (still starting?)"
        else:
            for key in ("uptime_s", "temp_c", "rung", "rungs", "choice"):
                body[key] = h.get(key)
            body["rate_hz"] = (h.get("pipeline") or {}).get("rate_hz")
        return (200 if alive else 503), body

    def start(self, port: int | None = None) -> LocalApi:
        """Bind `cfg.host:cfg.port` (or `port`) and serve. A port that cannot be bound raises
        ConfigError naming the address, so `serve` fails at start-up instead of running blind."""
        addr = (self.cfg.host, self.cfg.port if port is None else port)
        try:
            self.server = BoundedHTTPServer(addr, _handler(self), MAX_CONNECTIONS)
        except OSError as e:  # a config problem for the operator, not a crash
            raise ConfigError(f"local_api: cannot listen on {addr[0]}:{addr[1]}: {e} "
                              "(choose another port, or port = 0 to turn it off)") from e
        threading.Thread(target=self.server.serve_forever, name="local-api",
                         daemon=True).start()
        if self.cfg.host not in _LOOPBACK:
            log.warning("local API on %s:%d has no authentication: anyone who can reach this "
                        "address reads the device's health", self.cfg.host, self.port)
        log.info("local API: http://%s:%d/metrics and /healthz", self.cfg.host, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def start_local_api(cfg: LocalApiConfig, health: Callable[[], dict[str, Any]],
                    alive: Callable[[], bool], device: str = "") -> LocalApi | None:
    """A started LocalApi, or None when `cfg.port` is 0 (off)."""
    if cfg.port == 0:
        return None
    return LocalApi(cfg, health, alive, device).start()


    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler(api: LocalApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = api.cfg.timeout_s  # applied to the socket: idle or trickling clients leave

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _json(self, status: int, body: Any) -> None:
            self._send(status, json.dumps(body, default=str).encode(), "application/json")

        def do_GET(self) -> None:
            self.close_connection = True
            try:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    return self._send(200, generate_latest(api.registry), metrics.CONTENT_TYPE)
                if path == "/healthz":
                    return self._json(*api.healthz())
                self._json(404, {"error": f"no such endpoint: {path[:100]}; "
                                          "try /metrics or /healthz"})
            except Exception:  # a bug costs this request, never the daemon
                log.exception("local API request GET %s failed", self.path[:200])
                with contextlib.suppress(OSError):
                    self._json(500, {"error": "internal error; see the daemon's log"})

    return Handler
