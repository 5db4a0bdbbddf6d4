"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver, driven over
WebDriver by tests/support/webdriver.py), against a real coordinator, a real Mosquitto and a device
process: devices appear in the table, a killed device turns offline within its keepalive, a
command goes button -> coordinator -> device -> signed reply shown, a device page draws its
timelines and shows hostile event text as text.

CI installs chromium and chromium-driver (.ci/run); elsewhere the browser tests skip, saying
so. EDGERUN_SCREENSHOT=DIR keeps the screenshots (docs/img/dashboard.png is one of them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.fleet import Device, read_lines, start_coordinator
from support.webdriver import Browser, find_browser

from runtime.coordinator.api import serve
from runtime.wire import commands, payloads

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="chromium and chromedriver are not installed (apt-get install "
                            "chromium chromium-driver; CI installs them)")
FLEET_POLL_S = 2.0  # app.js FLEET_POLL_MS


@pytest.fixture
def browser(tmp_path):
    b = Browser(*BROWSER, tmp_path)
    yield b
    b.quit()


def _keep(b: Browser, tmp_path: Path, name: str) -> None:
    """Screenshot to tmp_path, and to $EDGERUN_SCREENSHOT when set."""
    b.screenshot(tmp_path / name)
    if out := os.environ.get("EDGERUN_SCREENSHOT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / name, Path(out) / name)


def _status(b: Browser, device: str) -> str:
    return b.js("const r = document.querySelector(`#fleet-table tr[data-device='${arguments[0]}`"
                " + \"'] .status-cell\"); return r ? r.textContent : '';", device)


def _login(b: Browser, url: str, token: str) -> None:
    b.get(url)
    b.wait(lambda: b.js("return !document.querySelector('#login').hidden"), 30, "token form")
    assert b.js("return document.querySelector('#fleet-view').hidden")
    b.type("#token", token)
    b.click("#token-submit")


def test_devices_appear_a_killed_one_goes_offline_and_a_command_round_trips(
        tmp_path, broker, browser):
    commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    coord = start_coordinator(tmp_path, broker, signing_key=str(tmp_path / "k.pem"),
                              offline_alert_s=0.5)  # the offline alert, once it lasts
    api = serve(coord, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{api.server_address[1]}/"
    token = (tmp_path / "api-token").read_text().strip()
    keepalive = 2
    dev = Device(tmp_path, broker, 5, keepalive=keepalive, trusted_key=tmp_path / "k.pub")
    dev.start()
    b = browser
    try:
        # the page holds no token: without one the API refuses even the browser's own fetch
        b.get(url)
        assert b.js("return fetch('/api/v1/fleet').then(r => r.status)") == 401
        _login(b, url, token + "x")  # a wrong token: back to the form, saying so
        b.wait(lambda: b.text("#login-error") == "token refused", 30, "wrong token refused")
        assert b.js("return sessionStorage.length") == 0  # not kept
        _login(b, url, token)
        b.wait(lambda: _status(b, "dev1") == "online", 30, "dev1 online in the table")
        assert "1 devices, 1 online" in b.text("#fleet-count")

        # command round trip: the button, the coordinator's signed command, the device's
        # signed reply shown on the page
        b.click("#fleet-table tr[data-device='dev1'] a")
        b.wait(lambda: b.text("#dev-name") == "dev1", 30, "device page")
        b.click("button[data-cmd='ping']")
        b.wait(lambda: b.js("return document.querySelector('#cmd-result').dataset.status"),
               15, "ping reply")
        shown = b.text("#cmd-result")
        assert shown.startswith("ping: done") and "signed by the device" in shown, shown
        b.type("#arg-ms", "15")
        b.click("button[data-cmd='set_latency_target']")
        b.wait(lambda: b.text("#cmd-result").startswith("set_latency_target: accepted"), 15,
               "set_latency_target accepted")
        b.wait(lambda: "cmd set_latency_target" in read_lines(tmp_path / "device.out"), 30,
               "the device process received the typed command")
        # refused before it is signed (the coordinator checks the schema every device holds,
        # issue 36); the page says so, naming the argument
        b.type("#arg-fps", "-3")
        b.click("button[data-cmd='set_rate']")
        b.wait(lambda: b.text("#cmd-result").startswith("set_rate: refused"), 15,
               "set_rate refused")
        assert "fps" in b.text("#cmd-result"), b.text("#cmd-result")
        assert "bad" in b.js("return document.querySelector('#cmd-result').className")

        # kill -9: the broker sends the will after 1.5 keepalives; the table follows
        b.click("h2 a[href='#/']")
        b.wait(lambda: _status(b, "dev1") == "online", 30, "back on the fleet table")
        dev.kill9()
        t0 = time.monotonic()
        b.wait(lambda: _status(b, "dev1") == "offline", keepalive * 1.5 + FLEET_POLL_S + 5,
               "dev1 offline in the table")
        took = time.monotonic() - t0
        assert took <= keepalive * 1.5 + 1.0 + FLEET_POLL_S + 1.0, took
        # and the offline alert is listed, active and as a transition
        b.wait(lambda: b.js("return !!document.querySelector("
                            "\"#alerts-active tr[data-device='dev1'][data-alert='offline']\")"),
               FLEET_POLL_S * 3, "offline alert active")
        recent = b.text("#alerts-recent tbody")
        assert "dev1" in recent and "offline" in recent and "raised" in recent
        _keep(b, tmp_path, "dashboard-fleet.png")
    finally:
        if dev.proc.poll() is None:
            dev.term()
        api.shutdown()
        coord.stop()


def _publish(broker, device: str, messages: list[tuple[str, dict]]) -> None:
    """Publish as `device` through the broker, as the device's publisher would."""
    creds = broker.device("test", device)
    cli = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      protocol=mqtt.MQTTv5)
    cli.username_pw_set(creds.username, Path(creds.password_file).read_text().strip())
    cli.connect("127.0.0.1", broker.port)
    cli.loop_start()
    try:
        for kind, msg in messages:
            cli.publish(payloads.topic("test", device, kind), json.dumps(msg), qos=1
                        ).wait_for_publish(10)
    finally:
        cli.loop_stop()
        cli.disconnect()


def _day(now: float, n: int = 240) -> list[tuple[str, dict]]:
    """A device warming towards its trip and stepping down, an hour of health."""
    out: list[tuple[str, dict]] = [("state", {"v": 1, "online": True, "boot": "b1", "t": now,
                                              "versions": {"edgerun": "test"},
                                              "model": "inspection"})]
    for i in range(n):
        temp = 55.0 + 27.0 * i / n
        rung = 4 if temp < 70 else 3 if temp < 78 else 2
        out.append(("health", {
            "v": 1, "t": now - 3600 + i * 3600 / n, "boot": "b1", "temp_c": round(temp, 2),
            "passive_trip_c": 85.0, "throttled": False, "rung": rung, "rungs": 4,
            "accuracy": 0.97 - 0.01 * (4 - rung), "power_w": 2.0 + 0.6 * rung,
            "rung_energy_mj": 20.0 * rung, "battery_frac": 0.9 - 0.3 * i / n,
            "harvest_w": 3.0 if i < n / 2 else 0.5, "sensor_problems": [],
            "pipeline": {"rate_hz": 20.0, "latency_ms": {"p50": 8.0, "p95": 10.0 + rung}},
            "slo": {"target_ms": 20.0, "compliance": 0.99},
            "backlog": {"results_held": 2, "bytes": 100, "oldest_seq": None,
                        "evicted_total": 0}}))
    last = dict(out[-1][1], t=now, sensor_problems=["battery: capacity unreadable"])
    out.append(("health", last))
    out.append(("event", {"v": 1, "t": now, "type": "rung_changed", "severity": "info",
                          "reason": "<img src=x onerror=\"document.title='pwned'\">hot"}))
    return out


def test_device_page_draws_timelines_and_shows_hostile_text_as_text(tmp_path, broker, browser):
    coord = start_coordinator(tmp_path, broker)
    api = serve(coord, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{api.server_address[1]}/"
    token = (tmp_path / "api-token").read_text().strip()
    b = browser
    try:
        messages = _day(time.time())
        _publish(broker, "box7", messages)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not coord.store.events("box7", 1):
            time.sleep(0.1)
        _login(b, url, token)
        b.wait(lambda: _status(b, "box7") == "online", 20, "box7 in the table")
        row = b.text("#fleet-table tr[data-device='box7']")
        assert "2/4" in row and "81.9 / 85" in row and "60 %" in row, row
        assert b.js("return document.querySelector(\"#fleet-table tr[data-device='box7'] "
                    ".temp\").classList.contains('hot')")
        assert "sensor" in b.text("#fleet-table tr[data-device='box7'] .alerts")
        b.click("#fleet-table tr[data-device='box7'] a")
        b.wait(lambda: b.js("return document.querySelectorAll('.uplot canvas').length") == 5,
               15, "five charts")
        b.wait(lambda: "points" in b.text("#history-note"), 30, "history drawn")
        points = int(b.text("#history-note").split()[0])
        assert 200 <= points <= 242, points  # an hour of health in buckets of 6 s
        # the rung chart has the step down: its series data as uPlot holds it
        assert "2/4" in b.text("#dev-summary") and "81.9 °C" in b.text("#dev-summary")
        events = b.text("#events tbody")
        assert "rung_changed" in events and "<img src=x" in events  # shown, not parsed
        assert b.js("return document.querySelectorAll('#events img').length") == 0
        assert b.js("return document.title") == "edgerun fleet"
        assert "sensor" in b.text("#dev-alerts")
        _keep(b, tmp_path, "dashboard-device.png")
    finally:
        api.shutdown()
        coord.stop()


def test_an_alert_that_stopped_shows_clearing_until_it_settles(tmp_path, broker, browser):
    """The Active list keeps an alert that has left the device's view as "clearing" until
    coordinator.alert_clear_s has passed and its clear is recorded; then it is gone from
    Active and listed as a `cleared` transition."""
    clear_s = 8.0
    coord = start_coordinator(tmp_path, broker, alert_clear_s=clear_s)
    api = serve(coord, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{api.server_address[1]}/"
    token = (tmp_path / "api-token").read_text().strip()
    b = browser
    row = "#alerts-active tr[data-device='box3'][data-alert='hot']"

    def state() -> str:
        return b.js(f"const r = document.querySelector(\"{row}\"); "
                    "return r ? r.dataset.state : '';")

    try:
        now = time.time()
        _publish(broker, "box3", [
            ("state", {"v": 1, "online": True, "boot": "b1", "t": now}),
            ("health", {"v": 1, "t": now, "boot": "b1", "temp_c": 84.0,
                        "passive_trip_c": 85.0})])
        _login(b, url, token)
        b.wait(lambda: state() == "active", 20, "hot alert active")
        _publish(broker, "box3", [("health", {"v": 1, "t": time.time(), "boot": "b1",
                                              "temp_c": 50.0, "passive_trip_c": 85.0})])
        b.wait(lambda: state() == "clearing", FLEET_POLL_S * 3, "hot alert clearing")
        shown = b.text(row)
        assert "clearing (settles in" in shown, shown
        recent = b.text("#alerts-recent tbody")
        assert "raised" in recent and "cleared" not in recent, recent
        _keep(b, tmp_path, "dashboard-clearing.png")
        b.wait(lambda: state() == "", clear_s + FLEET_POLL_S * 3, "hot alert settled")
        b.wait(lambda: "cleared" in b.text("#alerts-recent tbody"), FLEET_POLL_S * 3,
               "cleared transition listed")
    finally:
        api.shutdown()
        coord.stop()
