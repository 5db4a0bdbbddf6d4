"""`edgerun report`: the local health history, the coordinator's history endpoint, and the
PNG/HTML rendered from a real daemon run and from health stored by a real coordinator."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import subprocess
import sys
import time
import urllib.request

import pytest
from support.daemon_harness import Serve, write_config
from support.under_test import child_env
from support.waiting import wait

from runtime.coordinator.api import BadRequest, health_query
from runtime.tools import day_report
from runtime.wire import health_history

# the tests that draw need matplotlib (the [report] extra; the [test] extra has it too)
needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                               reason="matplotlib is not installed")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _health(t: float, **kw) -> dict:
    h = {"v": 1, "t": t, "boot": "b", "temp_c": 55.0, "passive_trip_c": 70.0,
         "throttled": False, "rung": 3, "rungs": 3, "power_w": 4.0, "battery_frac": 0.9,
         "rung_energy_mj": 12.0, "accuracy": 0.97,
         "pipeline": {"rate_hz": 10.0, "latency_ms": {"p50": 3.0, "p95": 5.0}},
         "slo": {"target_ms": 20.0}}
    h.update(kw)
    return h


def test_history_is_bounded_rotated_and_read_in_order(tmp_path):
    hist = health_history.HealthHistory(tmp_path, max_bytes=4096)
    t0 = 1_700_000_000.0
    for i in range(100):
        hist.append(_health(t0 + i), {"hot": 80.0, "critical": 95.0})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["health-history.jsonl", "health-history.jsonl.1"]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    recs = health_history.read(tmp_path)
    ts = [r["t"] for r in recs]
    assert ts == sorted(ts) and ts[-1] == t0 + 99 and len(recs) >= 20
    assert recs[-1]["trips"] == {"hot": 80.0, "critical": 95.0, "passive": 70.0}
    assert recs[-1]["p95_ms"] == 5.0 and recs[-1]["target_ms"] == 20.0
    assert health_history.read(tmp_path, since=t0 + 95) == recs[-5:]


def test_damaged_or_hostile_lines_cost_only_themselves(tmp_path):
    hist = health_history.HealthHistory(tmp_path)
    hist.append(_health(100.0))
    with (tmp_path / health_history.NAME).open("a") as f:
        f.write('{"t": 101, "temp_c": "hot", "rung": NaN, "trips": {"x": "y"}}\n')
        f.write("not json\n[1,2]\n" + "{" * 5000 + "\n" + '{"t": 1e400}\n')
        f.write('{"t": 102, "temp_c": 60')  # a power cut mid-line
    hist.append(_health(103.0, temp_c=None))
    recs = health_history.read(tmp_path)
    assert [r["t"] for r in recs] == [100.0, 101.0, 103.0]
    assert recs[1]["temp_c"] is None and recs[1]["rung"] is None and recs[1]["trips"] == {}


def test_a_write_that_fails_is_counted_not_raised(tmp_path):
    hist = health_history.HealthHistory(tmp_path / "missing-dir")
    hist.append(_health(1.0))
    assert hist.errors == 1


def test_gaps_break_lines_and_are_not_integrated():
    recs = [health_history.record(_health(t)) for t in (0, 10, 20, 30, 3630, 3640)]
    broken = day_report._break_gaps(recs)
    assert len(broken) == 7 and broken[4]["t"] == 1830 and "temp_c" not in broken[4]
    wh = day_report.energy_wh(recs)
    # 4 W for 30 s, then nothing across the hour-long gap, then 4 W for 10 s
    assert wh[-1] == pytest.approx(4.0 * 40 / 3600)


def test_parse_when():
    now = 1_000_000.0
    assert day_report.parse_when("24h", now) == now - 86400
    assert day_report.parse_when("90m", now) == now - 5400
    assert day_report.parse_when("1700000000", now) == 1_700_000_000
    assert day_report.parse_when("2026-05-01T08:00+00:00", now) == 1777622400
    with pytest.raises(ValueError, match="not a time"):
        day_report.parse_when("yesterday", now)


def test_health_query_validates():
    assert health_query("", now=1000.0 * 86400) == (999 * 86400.0, 1000 * 86400.0, 5000)
    assert health_query("since=5&until=10&limit=3") == (5.0, 10.0, 3)
    for bad in ("since=-1", "limit=0", "limit=999999", "since=1e9", "x=1", "since=1&since=2"):
        with pytest.raises(BadRequest):
            health_query(bad)


def test_missing_matplotlib_is_said_clearly(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    tl = day_report.Timeline("d", "test", [health_history.record(_health(1.0))])
    with pytest.raises(day_report.MissingExtra, match=r"pip install 'edgerun\[report\]'"):
        day_report.render_png(tl)


def test_html_escapes_everything_from_outside():
    recs = [health_history.record(_health(1_700_000_000.0 + i * 5)) for i in range(3)]
    tl = day_report.Timeline('<script>alert(1)</script>', "test", recs,
                             events=[{"t": 1_700_000_005.0, "type": "<b>x</b>",
                                      "severity": "critical"}])
    page = day_report.render_html(tl, b"\x89PNG fake")
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>x</b>" not in page


@needs_mpl
def test_report_of_a_real_daemon_run_from_its_state_dir(tmp_path):
    """A real `serve` writes health-history.jsonl; `edgerun report --local` draws it."""
    cfg = write_config(tmp_path, tmp_path / "cache")
    d = Serve(tmp_path, cfg)
    hist = tmp_path / "state" / health_history.NAME
    try:
        wait(d.ready, 180, "the daemon ready", d)
        wait(lambda: hist.exists() and len(hist.read_text().splitlines()) >= 8, 30,
             "8 health records", d)
    finally:
        assert d.stop() == 0
    recs = health_history.read(tmp_path / "state")
    assert all(r["temp_c"] == 40.0 for r in recs)  # the fake sysfs zone reads 40 °C
    assert all(r["rung"] and r["rungs"] and r["power_w"] for r in recs)
    out, page = tmp_path / "day.png", tmp_path / "day.html"
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "report", "--local", "--config",
                           str(cfg), "--since", "1h", "--out", str(out), "--html", str(page),
                           "--utc"], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert proc.returncode == 0, proc.stderr
    assert "box1" in proc.stdout and f"{len(recs)} health records" in proc.stdout
    assert png_size(out.read_bytes()) == (day_report.WIDTH_PX, day_report.HEIGHT_PX)
    text = page.read_text()
    assert "data:image/png;base64," in text and "<td>40.0</td>" in text
    assert "box1" in text and "(UTC)" in text


@needs_mpl
def test_report_refuses_an_empty_window(tmp_path):
    health_history.HealthHistory(tmp_path).append(_health(1000.0))
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "report", "--local", "dev",
                           "--state-dir", str(tmp_path), "--since", "1h"],
                          capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.returncode == 2 and "no health records for dev" in proc.stderr


def test_report_names_the_coordinator_it_cannot_reach(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "token").write_text("t\n")
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "report", "dev1", "--api",
                           f"http://127.0.0.1:{port}", "--token-file", str(tmp_path / "token")],
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("edgerun report: GET /api/v1/devices/dev1: cannot reach "
                                  f"the coordinator at http://127.0.0.1:{port}"), proc.stderr
    assert "Traceback" not in proc.stderr


@needs_mpl
def test_report_from_the_coordinator_history(tmp_path, broker):
    """Health published by a device over a real broker, stored by a real coordinator, read
    back through the API's health endpoint and drawn, with a gap where it was silent."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.config.telemetry import OutboxConfig, TelemetryConfig
    from runtime.coordinator.api import ensure_token, serve
    from runtime.coordinator.service import Coordinator
    from runtime.telemetry.outbox import Outbox
    from runtime.telemetry.publisher import Publisher
    from runtime.wire import commands

    (tmp_path / "keys").mkdir()
    commands.generate_keypair(tmp_path / "device.key", tmp_path / "keys" / "dev1.pub")
    coord = Coordinator(CoordinatorConfig(
        fleet="test", broker=broker.coordinator("test", keepalive_s=5),
        device_keys=str(tmp_path / "keys"), store=str(tmp_path / "coord.db")))
    coord.start()
    assert coord.connected.wait(30)
    token = ensure_token(tmp_path / "token")
    server = serve(coord, "127.0.0.1", 0, token)
    api = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = TelemetryConfig(fleet="test", device="dev1", broker=broker.device("test", "dev1"),
                          outbox=OutboxConfig(path=str(tmp_path / "dev.db"), health_keep=500))
    outbox = Outbox(cfg.outbox)
    pub = Publisher(cfg, outbox, state_dir=tmp_path)
    pub.start()
    now = time.time()
    times = [now - 7200 + i * 60 for i in range(60)] + [now - 1200 + i * 60 for i in range(20)]
    try:
        for i, t in enumerate(times):
            outbox.put("health", _health(t, boot=outbox.boot, temp_c=50 + 20 * math.sin(i / 9),
                                         throttled=i % 9 > 6, rung=1 + i % 3,
                                         battery_frac=1 - i / 100))
        wait(lambda: len(coord.store.health_history("dev1", 0, now + 1, 1000)) == 80, 20,
             "80 stored health messages")
        req = urllib.request.Request(f"{api}/api/v1/devices/dev1/health?since=0&limit=40",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            thinned = json.loads(resp.read())["health"]
        assert len(thinned) == 40 and thinned[0]["t"] == pytest.approx(times[0])
        req = urllib.request.Request(f"{api}/api/v1/devices/nobody/health",
                                     headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 404
        tl = day_report.from_api(api, token, "dev1", now - 3 * 3600, now + 1)
        assert [r["t"] for r in tl.records] == pytest.approx(times)
        assert tl.records[10]["rung"] == 2 and tl.records[0]["trips"] == {"passive": 70.0}
        png = day_report.render_png(tl, width_px=1000, height_px=1200)
        assert png_size(png) == (1000, 1200)
        rows = day_report.hourly(tl)
        assert sum(r["energy_wh"] for r in rows) == pytest.approx(
            day_report.energy_wh(tl.records)[-1])
    finally:
        pub.stop()
        outbox.close()
        server.shutdown()
        coord.stop()


def test_a_simulated_device_is_drawn_on_its_own_clock(tmp_path):
    """A simulator runs a day in minutes: its records carry the simulated time of day, and
    the report draws that day (and integrates energy over it), not the minutes of wall."""
    hist = health_history.HealthHistory(tmp_path)
    wall0 = 1_700_000_000.0
    for i in range(49):  # 24 simulated hours, every 30 simulated minutes, 1 s of wall apart
        hist.append(_health(wall0 + i, simulated={"t": 6 * 3600 + i * 1800.0}))
    tl = day_report.from_state_dir(tmp_path, "sim", wall0 - 1, wall0 + 60)
    assert tl.simulated and tl.records[-1]["t"] - tl.records[0]["t"] == 24 * 3600
    assert day_report.energy_wh(tl.records)[-1] == pytest.approx(4.0 * 24)
    assert tl.records[0]["t"] % 86400 == 6 * 3600  # 06:00 on the simulated clock
    assert "simulated device clock" in day_report.render_html(tl, b"png")
    assert len(day_report.hourly(tl)) == 25


@pytest.mark.parametrize("span_s, fmt", [
    (120, "%H:%M:%S"),  # an outside run's 2-minute window read "06:00 06:00 06:00"
    (1800, "%H:%M:%S"),
    (1801, "%H:%M"),
    (24 * 3600, "%H:%M"),
    (36 * 3600 + 1, "%m-%d %H:%M"),
])
def test_the_time_axis_labels_fit_the_window(span_s, fmt):
    assert day_report.axis_format(span_s) == fmt


# -- a sleeping (duty-cycled) node: runtime/device/sleep.py, docs/sleep.md ---------------------

def _cycle(times, wakes=None, results=None, power_w=1.2, t0=0.0):
    """Records at `times` (s after `t0`); `wakes`: {index: t} where that record is the last
    health before a sleep announcing its wake; `results`: the pipeline's running count."""
    wakes, out = wakes or {}, []
    for i, t in enumerate(times):
        h = _health(t0 + t, power_w=power_w)
        if i in wakes:
            h["sleep"] = {"mode": "sleep", "phase": "deliver", "next_wake": t0 + wakes[i]}
        if results is not None:
            h["pipeline"] = {**h["pipeline"], "results": results[i]}
        out.append(health_history.record(h))
    return out


@pytest.mark.parametrize("what, times, wakes, sleeps, typical, awake_s, breaks", [
    # a node with a 5 s health awake ~12 s a wake, every 300 s: the sleeps were gaps with
    # nothing known (the 2 s after each wake, and the sleeps, left out of the energy)
    ("a few records a wake", [0, 5, 10, 302, 307, 312, 602, 607, 612],
     {2: 300, 5: 600, 8: 900}, [(10, 300), (312, 600), (612, 900)], 5.0, 34.0, 2),
    # one health a wake and the announcing one: the median step was a sleep's length, so
    # nothing was a gap and the node was drawn and integrated awake all along (910 s)
    ("one record a wake", [0, 20, 310, 330, 610, 630, 910],
     {1: 300, 3: 600, 5: 900}, [(20, 300), (330, 600), (630, 900)], 20.0, 90.0, 3),
    # the wake never came: asleep until the announced wake, then a gap (an outage)
    ("a missed wake", [0, 5, 10, 4000, 4005], {2: 300}, [(10, 300)], 5.0, 15.0, 1),
    # woken before the announced time (the next record came first): asleep until it
    ("woken early", [0, 5, 10, 100, 105], {2: 300}, [(10, 100)], 5.0, 15.0, 1),
    # a node that never sleeps: as before, the hour of silence is a gap
    ("awake, off an hour", [0, 5, 10, 3610, 3615], {}, [], 5.0, 15.0, 1),
    # records stored unevenly (two or three close, then a pause: a coordinator admitted a
    # share of a 50x simulated node's health): the median step (5 s) made every pause a gap
    # and the report from the API counted 0.10 Wh where the node's own history had 0.53
    # health every 60 s, awake 15 s a wake but for one 130 s wake: the steps into the
    # announcing records (15 s) were the typical step, and that wake's 60 s steps gaps,
    # its energy not counted (55 s awake)
    ("one long wake", [0, 15, 300, 315, 600, 615, 900, 960, 1020, 1030, 1200],
     {1: 300, 3: 600, 5: 900, 9: 1200}, [(15, 300), (315, 600), (615, 900), (1030, 1200)],
     60.0, 175.0, 4),
    ("stored unevenly", [0, 5, 10, 55, 100, 105, 302, 307, 312, 357, 402, 407],
     {5: 300, 11: 600}, [(105, 300), (407, 600)], 45.0, 212.0, 1),
])
def test_a_sleeping_node_is_asleep_not_off_nor_awake(what, times, wakes, sleeps, typical,
                                                    awake_s, breaks):
    recs = _cycle(times, wakes)
    assert day_report.sleeps(recs) == sleeps, what
    assert day_report.typical_step(recs) == typical, what
    # energy: the awake draw over the time awake; a sleep's suspended draw is not in the
    # health (left out, and said so), a gap is not known
    assert day_report.energy_wh(recs)[-1] == pytest.approx(1.2 * awake_s / 3600), what
    # the lines stop at each sleep and gap (an empty record), and nowhere else
    assert len(day_report._break_gaps(recs)) - len(recs) == breaks, what


def test_the_hours_of_a_sleeping_node_count_its_results_and_its_sleep():
    hour = 1_700_002_800.0  # 2023-11-14 23:00 UTC
    # a restart before the 5th record (the count falls); a sleep through the hour after;
    # asleep at the end
    recs = _cycle([-20, -15, -10, 300, 305, 310, 7305], {2: 290, 5: 7300, 6: 7905},
                  results=[10, 12, 14, 15, 3, 4, 6], t0=hour)
    rows = day_report.hourly(day_report.Timeline("n", "test", recs), utc=True)
    assert [r["hour"] for r in rows] == ["2023-11-14 22:00", "2023-11-14 23:00",
                                         "2023-11-15 00:00", "2023-11-15 01:00"]
    # results from the running count (a count that fell is a restart: all of it is new);
    # the hour slept through has a row, with no results and no energy
    assert [r["results"] for r in rows] == [4, 1 + 3 + 1, 0, 2]
    assert [r["asleep_min"] for r in rows] == pytest.approx([10 / 60, (290 + 3290) / 60, 60,
                                                             100 / 60])
    # energy: the awake draw while awake (10 s; 10 s after the wake + 10 s; none; 5 s)
    assert [r["energy_wh"] for r in rows] == pytest.approx(
        [1.2 * s / 3600 for s in (10, 20, 0, 5)])
    assert rows[2]["battery_pct"] is None and rows[2]["rate_hz"] is None
    page = day_report.render_html(day_report.Timeline("n", "test", recs), b"png", utc=True)
    assert "asleep (min)" in page and "<th>results</th>" in page
    assert "2.02 h in 3 sleeps" in page  # 300 s + 6990 s, and asleep at the end
    assert "<th>results</th><td>11</td>" in page  # made in the window
    assert "asleep until 01:11" in page  # how the window ends: not "last seen", asleep


def test_the_sleep_is_kept_in_the_history_and_the_api_records():
    """The last health before a sleep (`sleep.next_wake`) and the pipeline's running count
    survive the history's compaction; a wake is kept as seconds after `t`, so a `t` the
    coordinator placed (the device's own in `clk.claimed`) moves the sleep with it."""
    h = _health(1_700_000_000.0, sleep={"next_wake": 1_700_000_280.5},
                pipeline={"rate_hz": 1.0, "results": 123457})
    r = health_history.record(h)
    assert r["asleep_s"] == 280.5 and r["results"] == 123457
    assert health_history.compact(r)["results"] == 123457  # exact, not 4 digits
    placed = {**h, "t": 1_700_000_900.0, "clk": {"sync": False, "claimed": 1_700_000_000.0}}
    assert health_history.record(placed)["asleep_s"] == 280.5
    awake = _health(1.0, sleep={"next_wake": None})
    assert "asleep_s" not in health_history.record(awake)


def test_a_simulated_sleep_is_drawn_on_the_device_clock(tmp_path):
    """At 100x a 280 s sleep lasts 2.8 s of wall: its announced wake (wall clock) becomes
    device seconds at the simulator's speed, not at the run's pace (slower here, a loaded
    host: 310 simulated s in 3.2 s of wall), which counted ~3 % of the sleep awake."""
    hist = health_history.HealthHistory(tmp_path)
    wall0 = 1_700_000_000.0
    for wall, sim, wake in ((0.0, 0.0, None), (0.1, 10.0, 2.9), (3.0, 300.0, None),
                            (3.2, 310.0, 3.4)):
        hist.append(_health(wall0 + wall, simulated={"t": 8 * 3600 + sim, "speed": 100.0},
                            sleep={"next_wake": None if wake is None else wall0 + wake}))
    tl = day_report.from_state_dir(tmp_path, "sim", wall0 - 1, wall0 + 60)
    t8 = tl.records[0]["t"]
    got = [t - t8 for span in day_report.sleeps(tl.records) for t in span]
    assert got == pytest.approx([10, 290, 310, 330], abs=0.01)


@needs_mpl
@pytest.mark.timeout(300)
def test_report_of_a_real_sleeping_node_from_its_state_dir(tmp_path):
    """`edgerun serve` on the simulated solar node with `[sleep]`, one simulated hour at 300x
    in lockstep (~15 s here; a burst of 2 every 300 s, 12 sleeps), drawn from its own
    history: the sleeps the plant counted, the results the outbox holds, the energy of the
    time awake (was: the idle draw all hour, 1.2 Wh, with one health a wake)."""
    import sqlite3

    from support.governor_day import PROFILES

    from models import bundled
    from runtime.device.profiles import load_profile
    from runtime.tools import simloop

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    run = simloop.run(tmp_path, "solar-node", "cool", "step_wise", 1.0, 2.0, PROFILES,
                      speed=300.0, battery_frac=0.5, accuracy_floor=0.9, source_hz=5 * 300.0,
                      timeout_s=240, extra="\n[sleep]\nenabled = true\nevery_s = 300\n"
                      "burst = 2\nflush_timeout_s = 2.0\n")
    assert run.exit_code == 0, (run.exit_code, run.log[-3000:])
    # the board stops once, where [simulator] hours end (was: a line for each tick left in
    # the control loop's batch, the plant run on past the end, on a loaded host)
    assert run.log.count("the simulated clock stops here") == 1, run.log[-3000:]
    sim, state = run.simulated, tmp_path / "state"
    assert sim["suspends"] >= 10, sim
    tl = day_report.from_state_dir(state, "loop", 0, math.inf)
    assert tl.simulated
    spans = [(a, min(b, tl.records[-1]["t"])) for a, b in day_report.sleeps(tl.records)]
    assert sim["suspends"] <= len(spans) <= sim["suspends"] + 1  # + asleep at the end
    asleep_h = sum(b - a for a, b in spans) / 3600
    assert asleep_h == pytest.approx(sim["suspended_h"], rel=0.02)  # 0.1 % in 3 runs
    con = sqlite3.connect(state / "outbox.db")
    try:
        stored = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    finally:
        con.close()
    rows = day_report.hourly(tl)
    # every result to the last health (the pipeline's own count: the first record has none,
    # the pipeline had not started), and the outbox (no broker: it has them all) holds those
    # and at most what was in flight when the board stopped: its capture stops with it (was,
    # on a loaded host, a burst no control tick ended any more: 4 after the last health)
    made = sum(r["results"] for r in rows)
    assert made == tl.records[-1]["results"] and 0 <= stored - made <= 2, (made, stored)
    assert sum(r["asleep_min"] for r in rows) / 60 == pytest.approx(asleep_h)
    # the awake draw (the health's 1.2 W idle) over the time the plant was awake (0.4 % in 3
    # runs), and what is left out is the suspended draw, which the health does not carry
    wh = day_report.energy_wh(tl.records)[-1]
    assert wh == pytest.approx(1.2 * (sim["elapsed_s"] / 3600 - sim["suspended_h"]), rel=0.05)
    suspended_w = load_profile("solar-node").states.suspended_w
    assert wh + asleep_h * suspended_w == pytest.approx(sim["energy_wh"], rel=0.05)
    assert png_size(day_report.render_png(tl, width_px=800, height_px=900)) == (800, 900)


@pytest.mark.parametrize("wake, asleep_s", [
    (2e9 + 300, 300.0),  # a sleep as announced
    (2e9 + 1e13, 7 * 86400.0),  # the year 318920: believed a week on, as the coordinator does
    (1e300, 7 * 86400.0),
    (float("nan"), None), (float("inf"), None), (2e9 - 5, None), ("soon", None), (True, None),
])
def test_a_hostile_announced_wake_is_believed_at_most_a_week_and_the_report_draws(wake, asleep_s):
    """A health announcing a wake in the year 318920 (a device clock gone wrong, a hostile
    health) made the report fail on a date out of range; NaN, a past wake, a string: none."""
    recs = [health_history.record({"t": 2e9 - 10 * i, "power_w": 1.0}) for i in (3, 2, 1)]
    recs.append(health_history.record({"t": 2e9, "power_w": 1.0,
                                       "sleep": {"next_wake": wake}}))
    assert recs[-1].get("asleep_s") == asleep_s
    tl = day_report.Timeline(device="d", source="test", records=recs)
    day_report.sleep_facts(tl, True)
    day_report.hourly(tl)
    if importlib.util.find_spec("matplotlib") is not None:
        assert png_size(day_report.render_png(tl, width_px=400, height_px=600)) == (400, 600)
