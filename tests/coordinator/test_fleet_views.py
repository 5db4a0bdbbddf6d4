"""`edgerun fleet ls` / `fleet show` (issue 14, item 8): tables that fit the terminal, with
rung, accuracy and rate; `show` a summary a person reads (`--json` keeps the raw view).
End to end: devices publish over a real Mosquitto, the coordinator's API serves them, the CLI
prints at COLUMNS=80 and 200."""

from __future__ import annotations

import json
import time

import pytest
from support.fleet import start_coordinator
from support.mqtt_probe import RICH_HEALTH, Sender
from support.waiting import wait

from runtime.cli import main
from runtime.coordinator import views
from runtime.coordinator.api import serve

TOKEN = "k" * 32
LONG = "conveyor-line-7-station-12-camera-left-upper"  # 44 characters: a real naming scheme


def _view(device: str = "dev1", **health) -> dict:
    """The API's view of a device (asdict(DeviceView) plus counts)."""
    return {"device": device, "online": True, "status": "online", "boot": "b1",
            "last_seen": 1000.0, "state_t": 990.0, "reason": "", "versions": {"edgerun": "0.1"},
            "model": "inspection", "choice": "inspection/fp32@onnxruntime:cpu:t4",
            "health": {"v": 1, "t": 999.0, "boot": "b1", **RICH_HEALTH, **health},
            "alerts": [["backlog", "1500 results held on the device (over 1000)"]],
            "results_stored": 123456, "quarantined": 0}


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_fleet_table_fits_and_keeps_the_important_columns(width):
    rows = [_view("dev1"), _view(LONG), _view("dev3", rung=0, rungs=0, accuracy=None)]
    rows[1]["alerts"] = [["hot", "x"], ["offline", "y"], ["sensor_missing", "z"]]
    text = views.fleet_table(rows, width=width, now=1004.0)
    lines = text.splitlines()
    assert len(lines) == 4 and all(len(line) <= width for line in lines), text
    head = lines[0].split()
    for col in ("DEVICE", "STATUS", "RUNG", "ACC", "RATE/s", "TEMP/TRIP", "ALERTS"):
        assert col in head, (width, text)
    assert "2/3" in lines[1] and "0.910" in lines[1] and "8.0" in lines[1]
    assert "61.5/70" in lines[1]
    if width >= 200:  # everything, nothing shortened
        for col in ("P95ms", "BATT", "BACKLOG", "RESULTS", "SEEN", "CHOICE"):
            assert col in head, text
        assert LONG in text and "hot,offline,sensor_missing" in text
        assert "inspection/fp32@onnxruntime:cpu:t4" in text and "4s" in lines[1]
        assert "42%" in lines[1] and "1500" in lines[1] and "123456" in lines[1]
    if width == 80:
        assert "CHOICE" not in head  # the first to go


def test_fleet_table_survives_odd_values_and_terminal_escapes():
    odd = _view("dev1", temp_c="hot", rung=True, pipeline=5, backlog=None)
    odd["choice"] = "fp32\x1b[2J\x1b]0;owned\x07"
    odd["alerts"] = "not a list"
    odd["health"]["battery_frac"] = float("nan")
    text = views.fleet_table([odd, {"device": 7}, "junk"], width=200, now=0.0)
    assert "\x1b" not in text and "\x07" not in text
    assert "fp32?[2J?]0;owned?" in text
    summary = views.device_summary({**odd, "events": [{"t": "x", "type": "\x1bboom"}, 5],
                                    "versions": ["no"]}, width=80)
    assert "\x1b" not in summary and all(len(line) <= 80 for line in summary.splitlines())


def test_device_summary_is_short_wrapped_and_complete():
    v = _view(LONG)
    v["alerts"].append(["hot", "die 76.2 °C is within 2 °C of the 78 °C passive trip; the "
                        "governor is stepping down, " + "and more words " * 8])
    v["events"] = [{"v": 1, "t": 990.0 - i, "type": "rung_changed", "severity": "info",
                    "from": "a", "to": "b", "reason": "61 °C rising"} for i in range(20)]
    for width in (80, 200):
        text = views.device_summary(v, width=width, now=1004.0)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), text
        assert len(lines) <= 30, text
        assert lines[0].startswith(f"{LONG}: online; last seen 4s ago"), text
        flat = " ".join(line.strip() for line in lines)
        for want in ("rung 2/3", "accuracy 0.910", "8.0 results/s", "p95 18.0 ms",
                     "61.5 °C (trip 70 °C", "3.25 W", "battery 42%", "1500 results held",
                     "123456 results at the coordinator", "backlog: 1500 results held",
                     "and more words and more words", "8 of 20", "edgerun 0.1"):
            assert want in flat, (want, text)


def test_fleet_cli_end_to_end_at_80_and_200_columns(tmp_path, broker, monkeypatch, capsys):
    coord = start_coordinator(tmp_path, broker)
    server = serve(coord, "127.0.0.1", 0, token=TOKEN, timeout_s=2)
    api = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "tok").write_text(TOKEN)
    probes = []
    try:
        for device in ("dev2", LONG):
            probe = Sender(broker.device("test", device))
            probes.append(probe)
            now = time.time()
            probe.pub(device, "state", {"v": 1, "online": True, "boot": "b2", "t": now,
                                        "model": "inspection",
                                        "choice": "inspection/fp32@onnxruntime:cpu:t4",
                                        "versions": {"edgerun": "9.9"}})
            probe.pub(device, "health", {"v": 1, "t": now, "boot": "b2", **RICH_HEALTH})
            probe.pub(device, "event", {"v": 1, "t": now, "type": "rung_changed",
                                        "severity": "info", "from": "a", "to": "b"})
        wait(lambda: all(coord.views.get(d) is not None and coord.views[d].health.get("rung")
                          == 2 for d in ("dev2", LONG)), 30, "both devices' health")
        wait(lambda: coord.store.events("dev2", 5), 30, "dev2's event")
        base = ["fleet", "--api", api, "--token-file", str(tmp_path / "tok")]
        for width in (80, 200):
            monkeypatch.setenv("COLUMNS", str(width))
            assert main([*base, "ls"]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert len(lines) == 3 and all(len(line) <= width for line in lines), lines
            assert all(c in lines[0] for c in ("RUNG", "ACC", "RATE/s")), lines
            assert "2/3" in lines[1] and "0.910" in lines[1]
            assert main([*base, "show", "dev2"]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert 8 <= len(lines) <= 30 and all(len(line) <= width for line in lines), lines
            assert lines[0].startswith("dev2: online"), lines
            assert any("rung_changed" in line for line in lines)
        assert main([*base, "show", "dev2", "--json"]) == 0
        raw = json.loads(capsys.readouterr().out)
        assert raw["device"] == "dev2" and raw["health"]["rung"] == 2 and raw["events"]
    finally:
        for probe in probes:
            probe.close()
        server.shutdown()
        coord.stop()


def test_device_summary_shows_the_boxs_energy_a_frame_beside_the_models():
    box = {"box_mj": 6.25, "model_mj": 0.102, "idle_mj": 4.1, "source": "rapl",
           "stages_mj": {}, "reason": None}
    flat = " ".join(views.device_summary(_view(box_energy=box), width=200, now=1004.0).split())
    assert "a frame: box 6.25 mJ, model 0.102 mJ, idle share 4.10 mJ (source rapl)" in flat
    none = {"box_mj": None, "model_mj": None, "idle_mj": None, "source": "estimated",
            "reason": "no frames in the last 60 s"}
    flat = " ".join(views.device_summary(_view(box_energy=none), width=200, now=1004.0).split())
    assert "a frame: box -, model -, idle share - (source estimated): no frames" in flat


def test_device_summary_says_when_the_devices_clock_is_not_synced():
    clk = {"state": "implausible", "reason": "the clock reads 1970-01-01 00:00:05 UTC",
           "implausible_total": 1, "jumps_total": 0, "last_jump_s": 0.0}
    flat = " ".join(views.device_summary(_view(clock=clk), width=200, now=1004.0).split())
    assert "clock implausible: the clock reads 1970-01-01 00:00:05 UTC; steps 0, " \
        "implausible readings 1 (its times are placed once it is synced)" in flat
    synced = {**clk, "state": "synced", "reason": "timesyncd"}
    flat = " ".join(views.device_summary(_view(clock=synced), width=200, now=1004.0).split())
    assert "placed once it is synced" not in flat  # a synced clock is not news
