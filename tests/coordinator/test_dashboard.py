"""The dashboard's HTTP side without a browser: what is served without the token (and with
which headers), the health timeline endpoint (bucketing, odd values as gaps, validation),
the alerts endpoint. The browser test is tests/coordinator/test_dashboard_browser.py."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import dashboard
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound
from runtime.wire import payloads


@pytest.fixture
def api(tmp_path):
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    server = serve(coord, "127.0.0.1", 0, timeout_s=2)
    token = (tmp_path / "api-token").read_text().strip()
    yield coord, server.server_address[1], token
    server.shutdown()
    coord.stop()


def _fetch(port: int, path: str, token: str | None = None) -> tuple[int, dict, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _feed(coord: Coordinator, device: str, healths: list[dict]) -> None:
    now = time.time()
    msgs = [(payloads.topic("f", device, "state"), payloads.encode("state", {
        "v": 1, "online": True, "boot": "b1", "t": now}), now)]
    msgs += [(payloads.topic("f", device, "health"), payloads.encode("health", h), now)
             for h in healths]
    coord._ingest(msgs)  # the real admission path: schema, store, view


def test_static_files_need_no_token_hold_none_and_forbid_framing(api):
    _, port, token = api
    status, headers, body = _fetch(port, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert token.encode() not in body and b"<script src=\"/static/app.js\">" in body
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    for path, ctype in (("/static/app.js", "text/javascript"),
                        ("/static/vendor/uplot/uPlot.iife.min.js", "text/javascript"),
                        ("/static/vendor/uplot/LICENSE", "text/plain")):
        status, headers, body = _fetch(port, path)
        assert status == 200 and headers["Content-Type"].startswith(ctype) and body
    # anything else is the API: the token is required, and no path reaches the file system
    for path in ("/static/../api-token", "/static/%2e%2e/api-token", "/api-token",
                 "/static/", "/static/app.js/", "/index.html"):
        assert _fetch(port, path)[0] == 401, path
        assert _fetch(port, path, token)[0] == 404, path
    assert _fetch(port, "/api/v1/alerts")[0] == 401
    assert _fetch(port, "/api/v1/devices/d/history")[0] == 401


def test_app_sets_device_text_as_text_only():
    # every device-supplied string reaches the page through textContent (el()); a test in
    # the browser checks the effect, this one that no HTML sink is used anywhere.
    src = (dashboard.STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in src, sink


def test_history_buckets_keep_peaks_and_step_downs(api):
    coord, port, token = api
    now = time.time()
    healths = []
    for i in range(1200):  # 20 minutes at 1 Hz, one spike and one brief step down
        healths.append({"v": 1, "t": now - 1200 + i, "boot": "b1",
                        "temp_c": 90.0 if i == 600 else 60.0, "passive_trip_c": 85.0,
                        "rung": 1 if i == 900 else 3, "rungs": 3, "power_w": 2.0,
                        "pipeline": {"rate_hz": 10.0, "latency_ms": {"p50": 1.0, "p95": 5.0}},
                        "slo": {"target_ms": 20.0, "compliance": 1.0}, "harvest_w": None})
    _feed(coord, "d1", healths)
    status, _, body = _fetch(port, "/api/v1/devices/d1/history?window_s=1800", token)
    assert status == 200
    h = json.loads(body)
    n = len(h["t"])
    assert 0 < n <= dashboard.MAX_POINTS and h["t"] == sorted(h["t"])
    assert all(len(h[name]) == n for name, _ in dashboard.HISTORY)
    assert max(h["temp_c"]) == 90.0 and min(h["rung"]) == 1  # not averaged away
    assert set(h["p95_ms"]) == {5.0} and set(h["target_ms"]) == {20.0}
    assert set(h["harvest_w"]) == {None} and set(h["battery_frac"]) == {None}
    # a shorter window holds only the newer part
    short = json.loads(_fetch(port, "/api/v1/devices/d1/history?window_s=120", token)[2])
    assert short["t"] and min(short["t"]) >= now - 121


def test_history_survives_odd_values_and_validates_its_query(api):
    coord, port, token = api
    _feed(coord, "d2", [{"v": 1, "t": time.time() - 5, "boot": "b1", "temp_c": 50.0}])
    # values the schema would refuse, stored as they are (a store bypassing admission, or a
    # schema that loosens later): each is a gap in the timeline, never an error
    coord.store.ingest([Inbound("d2", "health", {"t": time.time() - 4 + i, **odd})
                        for i, odd in enumerate([
                            {"temp_c": "hot", "rung": [1]}, {"temp_c": True, "pipeline": "x"},
                            {"temp_c": float("nan"), "slo": {"target_ms": float("inf")}},
                            {"temp_c": 1e308, "pipeline": {"latency_ms": None}}])])
    status, _, body = _fetch(port, "/api/v1/devices/d2/history?window_s=60", token)
    assert status == 200
    h = json.loads(body)
    assert sorted(x for x in h["temp_c"] if x is not None) == [50.0, 1e308]
    assert set(h["rung"]) == {None} and set(h["target_ms"]) == {None}
    for query, code in (("window_s=59", 400), ("window_s=-5", 400), ("window_s=1e9", 400),
                        ("window_s=3600&window_s=60", 400), ("x=1", 400),
                        ("window_s=99999999999", 400)):
        got = _fetch(port, f"/api/v1/devices/d2/history?{query}", token)
        assert got[0] == code and b"error" in got[2], query
    assert _fetch(port, "/api/v1/devices/nobody/history", token)[0] == 404


def test_timeline_is_pruned_with_the_health(tmp_path):
    from runtime.coordinator.store import Store

    store = Store(tmp_path / "s.db")
    now = time.time()
    store.ingest([Inbound("d", "health", {"t": now - age, "temp_c": 40.0})
                  for age in (10_000, 5_000, 10)])
    store.prune(keep_health_s=3600, keep_events_s=3600)
    rows = store.health_series("d", now - 20_000, now, [("temp_c", "MAX")])
    assert len(rows) == 1 and rows[0][0] == pytest.approx(now - 10)
    with pytest.raises(ValueError):
        store.health_series("d", 0, now, [("body); DROP TABLE health; --", "MAX")])
    store.close()


def test_alerts_endpoint_lists_active_alerts_and_transitions(api):
    coord, port, token = api
    _feed(coord, "d3", [{"v": 1, "t": time.time(), "boot": "b1", "temp_c": 84.0,
                         "passive_trip_c": 85.0}])
    coord.fleet_view()  # a refresh computes alerts
    status, _, body = _fetch(port, "/api/v1/alerts", token)
    assert status == 200
    view = json.loads(body)
    assert {(a["device"], a["alert"]) for a in view["active"]} == {("d3", "hot")}
    assert view["recent"][0]["device"] == "d3" and view["recent"][0]["state"] == "raised"
    assert view["webhook"] is None
    assert view["active"][0]["since"] == view["recent"][0]["t"]


def test_expensive_result_counts_are_reused_cheap_ones_are_not(api):
    coord, _, _ = api
    calls = []
    real = coord.store.counts

    def slow_counts():
        calls.append(1)
        time.sleep(0.05)  # as a store of some 300k results takes
        return real()

    coord.store.counts = slow_counts
    coord.fleet_view()
    coord.fleet_view()  # within 20 x 0.05 s: reused
    assert len(calls) == 1
    time.sleep(coord._counts[1] * 20 + 0.1)  # past the reuse window of the count's own time
    coord.fleet_view()
    assert len(calls) == 2
    coord.store.counts = lambda: calls.append(1) or real()  # fast: counted every time
    coord._counts = (0.0, 0.0, None)
    coord.fleet_view()
    coord.fleet_view()
    assert len(calls) == 4


@pytest.mark.parametrize("clear_s", [3600.0, 0.0])
def test_an_alert_gone_but_not_settled_is_listed_as_clearing(tmp_path, clear_s):
    """Between the alert leaving the device's view and its clear being recorded
    (alert_clear_s later) it is listed under `clearing`, with when it settles; once settled
    it is a `cleared` transition and in neither list."""
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          alert_clear_s=clear_s))
    try:
        t = time.time()
        _feed(coord, "d3", [{"v": 1, "t": t, "boot": "b1", "temp_c": 84.0,
                             "passive_trip_c": 85.0}])
        coord.fleet_view()
        _feed(coord, "d3", [{"v": 1, "t": t + 1, "boot": "b1", "temp_c": 50.0,
                             "passive_trip_c": 85.0}])
        coord.fleet_view()  # the alert leaves the view: the clear starts settling
        view = coord.alerts_view()
        assert view["active"] == []
        states = [a["state"] for a in view["recent"]]
        if clear_s:
            [c] = view["clearing"]
            assert (c["device"], c["alert"], c["status"]) == ("d3", "hot", "online")
            assert c["settles_at"] == pytest.approx(c["gone_at"] + clear_s)
            assert c["since"] == view["recent"][0]["t"] and states == ["raised"]
        else:  # settled at once: recorded as cleared, no longer clearing
            assert view["clearing"] == [] and states == ["cleared", "raised"]
    finally:
        coord.stop()
