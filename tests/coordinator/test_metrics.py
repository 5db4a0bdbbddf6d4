"""The coordinator's Prometheus `/metrics` (issue 14, item 2): scraped over real HTTP with the
API token after devices sent results and health through a real Mosquitto, parsed with
prometheus_client's own parser; odd or hostile health never breaks a scrape."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fleet import Device, start_coordinator
from support.mqtt_probe import RICH_HEALTH, Sender
from support.waiting import wait
from support.web import TOKEN, dev, samples, scrape

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
from runtime.wire import metrics, payloads

# Valid by the wire schema, odd for a gauge: nulls, a level that is a string, extremes.
ODD = {"temp_c": None, "passive_trip_c": None, "accuracy": None, "battery_frac": None,
       "power_w": 1e308, "rung_energy_mj": -1e308, "rate_cap_hz": None,
       "governor": {"level": "weird", "disabled_reason": None},
       "pipeline": {"rate_hz": None, "latency_ms": {"p50": None, "p95": None},
                    "frames_bad": {}, "frames": payloads.SEQ_MAX},
       "slo": {"target_ms": None, "compliance": None}}


def test_metrics_after_real_devices_over_mqtt(tmp_path, broker):
    coord = start_coordinator(tmp_path, broker)
    server = serve(coord, "127.0.0.1", 0, token=TOKEN, timeout_s=2)
    port = server.server_address[1]
    probe = Sender(broker.device("test", "dev2"))
    device = Device(tmp_path, broker, 120, rate=400).start()
    try:
        assert scrape(port, None)[0] == 401  # authenticated like the rest of the API
        assert scrape(port, TOKEN + "x")[0] == 401
        now = time.time()
        probe.pub("dev2", "state", {"v": 1, "online": True, "boot": "b2", "t": now,
                                    "model": "inspect", "choice": "ort-f32",
                                    "versions": {"edgerun": "9.9"}})
        probe.pub("dev2", "health", {"v": 1, "t": now, "boot": "b2", **RICH_HEALTH})
        wait(lambda: coord.store.counts().get("dev1", 0) >= 120, 30, "dev1's results")
        wait(lambda: (coord.views.get("dev2") is not None
                       and coord.views["dev2"].health.get("rung") == 2), 30, "dev2's health")

        status, text = scrape(port)
        assert status == 200, text
        got = samples(text)
        assert got[dev("edgerun_device_results_stored", "dev1")] == 120
        assert got[dev("edgerun_device_online", "dev1")] == 1
        assert got[("edgerun_fleet_results_stored", frozenset())] == 120
        assert got[("edgerun_fleet_devices", frozenset({"status": "online"}.items()))] == 2
        assert got[("edgerun_coordinator_messages_total",
                    frozenset({"kind": "health"}.items()))] >= 2
        expect = {"temperature_celsius": 61.5, "passive_trip_celsius": 70.0, "throttled": 0,
                  "battery_ratio": 0.42, "rung": 2, "rungs": 3, "accuracy_ratio": 0.91,
                  "power_watts": 3.25, "inference_energy_joules": 0.0125,
                  "governor_enabled": 1, "inference_rate_hz": 8.0,
                  "latency_p50_seconds": 0.010, "latency_p95_seconds": 0.018,
                  "latency_target_seconds": 0.020, "slo_compliance_ratio": 0.97,
                  "backlog_results": 1500, "backlog_bytes": 4096, "frames_total": 100,
                  "results_total": 98, "frames_bad_total": 2, "results_evicted_total": 0}
        for name, value in expect.items():
            assert got[dev("edgerun_device_" + name, "dev2")] == pytest.approx(value), name
        assert got[dev("edgerun_device_info", "dev2", model="inspect", choice="ort-f32",
                       version="9.9")] == 1
        assert got[dev("edgerun_device_alert", "dev2", alert="backlog")] == 1  # 1500 > 1000
        assert got[("edgerun_fleet_alerts_active", frozenset({"alert": "backlog"}.items()))] == 1

        # Odd but valid values, then an invalid health: the scrape goes on; what cannot be a
        # number is absent, and the refused message is counted where the operator looks.
        probe.pub("dev2", "health", {"v": 1, "t": time.time(), "boot": "b2", **ODD})
        probe.pub("dev2", "health", {"v": 1, "t": time.time(), "boot": "b2", "temp_c": "hot"})
        wait(lambda: coord.views["dev2"].health.get("power_w") == 1e308, 30, "the odd health")
        wait(lambda: coord.stats()["quarantined"]["total"] >= 1, 30, "the quarantine")
        status, text = scrape(port)
        assert status == 200, text
        got = samples(text)
        for absent in ("temperature_celsius", "accuracy_ratio", "inference_rate_hz",
                       "latency_p95_seconds", "battery_ratio", "rung", "backlog_results"):
            assert dev("edgerun_device_" + absent, "dev2") not in got, absent
        assert got[dev("edgerun_device_power_watts", "dev2")] == 1e308
        assert got[dev("edgerun_device_inference_energy_joules", "dev2")] == pytest.approx(
            -1e305)
        assert got[dev("edgerun_device_frames_total", "dev2")] == float(payloads.SEQ_MAX)
        assert got[dev("edgerun_device_quarantined_messages", "dev2")] == 1
        assert got[("edgerun_fleet_quarantined_messages", frozenset())] == 1
        assert got[("edgerun_coordinator_quarantined_total", frozenset())] == 1
        assert got[dev("edgerun_device_results_stored", "dev1")] == 120  # dev1 unaffected
    finally:
        device.term()
        probe.close()
        server.shutdown()
        coord.stop()


@pytest.fixture
def api(tmp_path):
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    server = serve(coord, "127.0.0.1", 0, token=TOKEN, timeout_s=2)
    yield coord, server.server_address[1]
    server.shutdown()
    coord.stop()


def test_a_view_no_schema_would_admit_does_not_break_the_scrape(api):
    """Views restored from an older store or set by a bug: every odd value is skipped."""
    coord, port = api
    from runtime.coordinator import fleet

    now = time.time()
    hostile = {"temp_c": "hot", "rung": True, "power_w": float("nan"),
               "accuracy": float("inf"), "pipeline": [1, 2],
               "backlog": {"results_held": "many", "evicted_total": -5},
               "slo": None, "governor": {"enabled": "yes"}, "battery_frac": 0.5}
    with coord._views_lock:
        coord.views["weird"] = replace(fleet.DeviceView("weird", online=True, status="online",
                                                        last_seen=now), health=hostile)
        coord.views["listy"] = replace(fleet.DeviceView("listy", online=True, status="online",
                                                        last_seen=now), health=[1, 2],
                                       model='a"b\\c\n} x{', versions={"edgerun": 5})
        coord.views["gone"] = replace(fleet.DeviceView("gone", status="offline"),
                                      health={"temp_c": 50.0})
    status, text = scrape(port)
    assert status == 200, text
    got = samples(text)
    weird = {name for name, labels in got if ("device", "weird") in labels}
    assert dev("edgerun_device_battery_ratio", "weird") in got  # the one good value
    for spec in metrics.SPECS:
        if spec.name != "battery_ratio":
            sample = "edgerun_device_" + spec.name
            assert sample not in weird, spec.name
    assert got[dev("edgerun_device_online", "listy")] == 1
    # A label value with quotes, backslashes and newlines is escaped, not injected.
    assert got[dev("edgerun_device_info", "listy", model='a"b\\c\n} x{', choice="",
                   version="5")] == 1
    # An offline device's last health is history, not a current reading.
    assert dev("edgerun_device_temperature_celsius", "gone") not in got
    assert got[dev("edgerun_device_status", "gone", status="offline")] == 1


@pytest.mark.parametrize("value, kind, expect", [
    (None, "gauge", None), ("3", "gauge", None), (True, "gauge", None), (True, "bool", 1.0),
    (1, "bool", None), (float("nan"), "gauge", None), (10 ** 400, "gauge", None),
    (-1, "counter", None), ([1], "gauge", None), (2.5, "gauge", 2.5)])
def test_read_skips_what_is_not_a_usable_number(value, kind, expect):
    spec = metrics.Spec("x", ("a", "b"), "x", kind=kind)
    assert metrics.read({"a": {"b": value}}, spec) == expect
    assert metrics.read({"a": value}, spec) is None  # not a mapping on the way


def test_every_name_in_the_grafana_dashboard_is_exposed(api):
    """The shipped dashboard queries only series the coordinator exposes (a renamed metric
    would leave its panel empty without anyone noticing)."""
    coord, port = api
    from runtime.coordinator import fleet

    with coord._views_lock:
        coord.views["d1"] = replace(fleet.DeviceView("d1", online=True, status="online",
                                                     last_seen=time.time()),
                                    health={**RICH_HEALTH, "rate_cap_hz": 5.0})
    status, text = scrape(port)
    assert status == 200
    exposed = set()
    for fam in text_string_to_metric_families(text):
        exposed.add(fam.name)
        exposed.update(s.name for s in fam.samples)
    board = json.loads((Path(__file__).parents[2] / "docs" / "grafana" /
                        "edgerun-fleet.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs.append(board["templating"]["list"][0]["query"]["query"])
    used = {m for e in exprs for m in re.findall(r"\bedgerun_[a-z0-9_]+", e)}
    assert len(used) > 20
    assert used <= exposed, sorted(used - exposed)
