"""An opt-in local HTTP endpoint on the device, for single-box users without a coordinator:

GET /metrics   the daemon's own health as Prometheus gauges (the same names as the
               coordinator's per-device series, runtime/wire/metrics.py, labelled with this device)
GET /healthz   200 {"status": "ok", ...} while the inference loop turns, 503 otherwise

Off by default (`[local_api] port = 0`). It has no authentication, so it binds 127.0.0.1
unless `host` says otherwise (a warning is logged then); it only reads, it never commands.
Requests are bounded: GET only, served by uvicorn (runtime/wire/httpserver.py) with a
connection silent for `timeout_s` closed, a request due whole within 3 x `timeout_s`, and at
most MAX_PER_CLIENT connections per address (MAX_CONNECTIONS in all).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from runtime.config.local_api import LocalApiConfig
from runtime.config.schema import ConfigError
from runtime.wire import metrics

if TYPE_CHECKING:  # the server (uvicorn) is imported at start, not by `edgerun check`
    from runtime.wire.httpapp import Request, Response
    from runtime.wire.httpserver import Server

log = logging.getLogger("edgerun.local_api")

MAX_CONNECTIONS = 64  # in all (each idle one costs a socket, not a thread)
MAX_PER_CLIENT = 16
WORKERS = 4  # threads answering requests (a scrape takes milliseconds)
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class HealthCollector:
    """Prometheus families from the daemon's health, read at scrape time."""

    def __init__(self, health: Callable[[], dict[str, Any] | None], alive: Callable[[], bool],
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


def read_health(health: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """The health message of the daemon's latest snapshot, or None before the first one
    (still starting). It is derived from one frozen DeviceState (runtime/device/state.py),
    never from state the main loop is changing, so one read is always whole."""
    h = health()
    if h is None:
        log.debug("health not available for the local API yet (still starting)")
    return h


class LocalApi:
    """The server: `start()` binds and serves on a daemon thread, `stop()` closes it."""

    def __init__(self, cfg: LocalApiConfig, health: Callable[[], dict[str, Any] | None],
                 alive: Callable[[], bool], device: str = ""):
        self.cfg = cfg
        self.health, self.alive = health, alive
        self.registry = CollectorRegistry()
        self.registry.register(HealthCollector(health, alive, device))
        ProcessCollector(registry=self.registry)
        self.server: Server | None = None

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

    def dispatch(self, req: Request) -> Response:
        """GET /metrics, GET /healthz; 404 for any other path, 501 for any other method.
        Every answer closes its connection (a scraper opens one per scrape anyway)."""
        from runtime.wire.httpapp import Response, json_response

        if req.method != "GET":
            return json_response(501, {"error": f"unsupported method {req.method[:20]!r}"},
                                 close=True)
        if req.path == "/metrics":
            return Response(200, generate_latest(self.registry), metrics.CONTENT_TYPE,
                            close=True)
        if req.path == "/healthz":
            return json_response(*self.healthz(), close=True)
        return json_response(404, {"error": f"no such endpoint: {req.path[:100]}; try "
                                            "/metrics or /healthz"}, close=True)

    def start(self, port: int | None = None) -> LocalApi:
        """Bind `cfg.host:cfg.port` (or `port`) and serve. A port that cannot be bound raises
        ConfigError naming the address, so `serve` fails at start-up instead of running blind."""
        from runtime.wire.httpapp import App
        from runtime.wire.httpserver import Limits, Server

        addr = (self.cfg.host, self.cfg.port if port is None else port)
        t = self.cfg.timeout_s
        try:
            self.server = Server(App(self.dispatch, WORKERS, stall_s=3 * t, name="local-api"),
                                 addr[0], addr[1],
                                 Limits(request_s=3 * t, idle_s=t,
                                        max_connections=MAX_CONNECTIONS,
                                        per_client=MAX_PER_CLIENT), name="local-api")
        except OSError as e:  # a config problem for the operator, not a crash
            raise ConfigError(f"local_api: cannot listen on {addr[0]}:{addr[1]}: {e} "
                              "(choose another port, or port = 0 to turn it off)") from e
        if self.cfg.host not in _LOOPBACK:
            log.warning("local API on %s:%d has no authentication: anyone who can reach this "
                        "address reads the device's health", self.cfg.host, self.port)
        log.info("local API: http://%s:%d/metrics and /healthz", self.cfg.host, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def start_local_api(cfg: LocalApiConfig, health: Callable[[], dict[str, Any] | None],
                    alive: Callable[[], bool], device: str = "") -> LocalApi | None:
    """A started LocalApi, or None when `cfg.port` is 0 (off)."""
    if cfg.port == 0:
        return None
    return LocalApi(cfg, health, alive, device).start()
