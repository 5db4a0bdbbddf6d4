"""The device's opt-in local /metrics and /healthz (issue 14, item 2): the server on its own
over real HTTP, the `[local_api]` config, and the real `edgerun serve` with it turned on."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from support.daemon_harness import Serve, write_config
from support.waiting import wait
from support.web import gauges

from models import bundled
from runtime.config import ConfigError, from_dict
from runtime.device.local_api import LocalApi, LocalApiConfig, start_local_api
from runtime.wire.broker import free_port


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET `path`."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_off_by_default_and_config_is_validated():
    assert start_local_api(LocalApiConfig(), dict, lambda: True) is None  # port 0: off
    assert from_dict({"local_api": {"port": 9101}}).local_api.port == 9101
    for bad in ({"port": 70000}, {"port": -1}, {"host": ""}, {"stall_s": 0},
                {"port": "9101"}, {"bogus": 1}):
        with pytest.raises(ConfigError, match="local_api"):
            from_dict({"local_api": bad})


def test_metrics_and_healthz_follow_the_callables():
    state = {"alive": True, "health": {"v": 1, "t": 1.0, "boot": "b", "temp_c": 48.5,
                                       "rung": 3, "rungs": 3, "choice": "ort",
                                       "pipeline": {"rate_hz": 9.0,
                                                    "latency_ms": {"p95": 12.0}}}}

    def health() -> dict | None:
        return state["health"]

    api = LocalApi(LocalApiConfig(), health, lambda: state["alive"], "box1").start(port=0)
    try:
        status, ctype, text = get(api.port, "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        g = gauges(text)
        assert g["edgerun_device_alive"] == 1 and g["edgerun_device_rung"] == 3
        assert g["edgerun_device_temperature_celsius"] == 48.5
        assert g["edgerun_device_latency_p95_seconds"] == pytest.approx(0.012)
        assert "edgerun_device_latency_p50_seconds" not in g  # absent in the health
        status, _, body = get(api.port, "/healthz")
        assert status == 200
        assert json.loads(body) == {"status": "ok", "alive": True, "uptime_s": None,
                                    "temp_c": 48.5, "rung": 3, "rungs": 3, "choice": "ort",
                                    "rate_hz": 9.0}
        # A stalled loop, and no snapshot to read yet (still starting).
        state["alive"], state["health"] = False, None
        status, _, body = get(api.port, "/healthz")
        assert status == 503 and json.loads(body)["status"] == "stalled"
        status, _, text = get(api.port, "/metrics")
        assert status == 200
        assert gauges(text) == {"edgerun_device_alive": 0.0}
        # Odd values in the health are skipped, the rest still shows.
        state["alive"], state["health"] = True, {"temp_c": "hot", "rung": 2, "pipeline": 5}
        status, _, text = get(api.port, "/metrics")
        assert status == 200 and gauges(text) == {"edgerun_device_alive": 1.0,
                                                  "edgerun_device_rung": 2.0}
        assert get(api.port, "/api/v1/fleet")[0] == 404
    finally:
        api.stop()


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_serve_exposes_its_health_and_liveness(tmp_path, tmp_path_factory):
    port = free_port()
    cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                       extra=f"[local_api]\nport = {port}\n")
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: d.ready(), 120, "the daemon ready", d)
        # the first health may come before the first sensor read: wait for both
        wait(lambda: gauges(get(port, "/metrics")[2]).get("edgerun_device_inference_rate_hz", 0)
             > 0 and "edgerun_device_temperature_celsius" in gauges(get(port, "/metrics")[2]),
             20, "a rate and a temperature in /metrics", d)
        status, _, text = get(port, "/metrics")
        g = gauges(text)
        assert status == 200 and g["edgerun_device_alive"] == 1
        assert g["edgerun_device_rung"] == g["edgerun_device_rungs"] >= 1  # the top rung
        assert g["edgerun_device_temperature_celsius"] == 40.0  # the fake sysfs zone
        assert g["edgerun_device_governor_enabled"] == 1
        assert g["edgerun_device_results_total"] > 0
        status, _, body = get(port, "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert json.loads(body)["temp_c"] == 40.0
        assert d.stop() == 0
        with pytest.raises(urllib.error.URLError):  # closed with the daemon
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        d.stop()


def test_serve_refuses_to_start_when_the_port_is_taken(tmp_path, tmp_path_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                           extra=f"[local_api]\nport = {port}\n")
        d = Serve(tmp_path, cfg)
        assert d.proc.wait(60) == 2
    assert f"local_api: cannot listen on 127.0.0.1:{port}" in d.text()
