"""Several sources, one budget: the aggregate latency target and planned rate (tables), the
fair queue, config checks, a real Pipeline with three lanes on ONNX Runtime, and `edgerun
serve` with [[sources]] on the bundled model (outbox and health as the coordinator admits
them)."""

from __future__ import annotations

import http.server
import math
import os
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.daemon_harness import Serve, events, last_health, results, write_config
from support.tiny_ort import tiny_active, tiny_variant
from support.waiting import wait

from models import bundled
from models.synthetic import samples
from runtime.choice.ladders import ladder_for
from runtime.choice.selector import Constraints, Profile
from runtime.config import ConfigError, from_dict
from runtime.config.source import SourceConfig
from runtime.frames.multisource import (
    UTILISATION_MAX,
    FairQueue,
    aggregate,
    lanes,
    planned_rate,
    shares,
    single,
    single_pace_hz,
)
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.sources import open_source

# -- the aggregate load (pure) ---------------------------------------------------------------


def test_one_stream_keeps_the_operators_target():
    assert aggregate(20.0, [10.0]) == (20.0, "")
    assert aggregate(20.0, []) == (20.0, "")


def test_several_streams_divide_the_target_by_the_burst_or_the_thread_capacity():
    # 4 cameras at 5 Hz, 100 ms each: a burst of 4 frames must be served in 100 ms
    ms, why = aggregate(100.0, [5, 5, 5, 5])
    assert ms == 25.0 and "4 sources at 20 Hz combined" in why and "4 streams x" in why
    # 4 cameras at 100 Hz: 400 Hz through one thread leaves 2 ms an inference (at 80 %)
    ms, why = aggregate(100.0, [100, 100, 100, 100])
    assert ms == pytest.approx(UTILISATION_MAX * 1e3 / 400) and "400 Hz combined" in why


def _p(vid: str, p95: float, mj: float, acc: float = 0.95) -> Profile:
    return Profile(vid, "m", "fp32", "onnxruntime", "cpu", 1, p50_ms=p95 * 0.8, p95_ms=p95,
                   p99_ms=p95 * 1.1, runs=100, energy_mj=mj, energy_source="estimated",
                   cpu_ms=p95, accuracy=acc)


def test_a_variant_must_serve_the_sum_of_the_rates_within_the_target():
    """The cheap variant meets 20 ms for one stream but not for four sharing it: with four,
    the selector must pick the faster one (more energy per inference, but the only one that
    keeps each stream within its target)."""
    profiles = [_p("slow-cheap", 9.0, 1.0), _p("fast-dear", 3.0, 2.0)]
    target = 20.0
    (top,), _ = ladder_for(profiles, Constraints(latency_ms=aggregate(target, [10])[0]))
    assert top.variant_id == "slow-cheap"
    rungs, reason = ladder_for(profiles, Constraints(latency_ms=aggregate(target, [10] * 4)[0]))
    assert [r.variant_id for r in rungs] == ["fast-dear"] and "p95 <= 5 ms" in reason


def test_the_box_plans_its_energy_at_the_combined_rate_and_shares_caps_by_rate():
    srcs = [SourceConfig(name="a", rate_hz=10), SourceConfig(name="b", rate_hz=30)]
    assert planned_rate(srcs, 10.0) == 40.0  # not one stream's 10 Hz
    assert planned_rate((), 10.0) == 10.0  # a single [source]: [governor] rate_hz as before
    assert shares([10, 30]) == [0.25, 0.75]
    # a rung's power at the planned rate is the whole box's inference power
    profiles = [_p("v", 2.0, 1.5)]
    (rung,), _ = ladder_for(profiles, Constraints(latency_ms=100))
    assert rung.power_w(planned_rate(srcs, 10.0)) == pytest.approx(1.5e-3 * 40)


# -- the fair queue ------------------------------------------------------------------------


def test_lanes_are_served_in_turn_and_a_live_lane_drops_only_its_own_frames():
    stop = threading.Event()
    q = FairQueue(["cam", "folder"], maxsize=2)
    for i in range(5):  # a fast camera: latest wins, on its own lane
        q.put("cam", f"cam-{i}", live=True, stop=stop)
    q.put("folder", "file-1", live=False, stop=stop)
    q.put("folder", "file-2", live=False, stop=stop)
    assert q.qsize("cam") == 2 and q.qsize("folder") == 2
    got = [q.get(0.1) for _ in range(4)]
    assert got == ["cam-3", "file-1", "cam-4", "file-2"]  # in turn; the folder lost nothing
    assert q.get(0.05) is None and q.empty()


def test_a_full_non_live_lane_blocks_its_own_producer_until_there_is_room():
    stop = threading.Event()
    q = FairQueue(["folder"], maxsize=1)
    q.put("folder", "a", live=False, stop=stop)
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.put("folder", "b", False, stop), done.set()))
    t.start()
    assert not done.wait(0.3)  # blocked: nothing was dropped
    assert q.get(0.1) == "a"
    assert done.wait(2) and q.get(0.1) == "b"
    t.join()


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "expected"), [
    ({"sources": [{"name": "a"}, {"name": "a"}]}, "names must be unique, a is used more"),
    ({"sources": [{"name": "a"}, {"kind": "synthetic"}]}, "entry 2 (synthetic) needs a name"),
    ({"sources": [{"name": "a", "rate_hz": 0}]}, "a: rate_hz must be > 0"),
    ({"source": {"rate_hz": 5}, "sources": [{"name": "a"}]}, "either one [source] or"),
    ({"sources": [{"name": "a", "roi": [0, 0, 200, 10]}]}, "outside the 96x96 frame"),
    ({"sources": [{"name": f"c{i}"} for i in range(65)]}, "at most 64 sources per daemon"),
])
def test_bad_sources_lists_are_refused_naming_the_key(data, expected):
    with pytest.raises(ConfigError, match=r"key 'sources") as e:
        from_dict(data)
    assert expected in str(e.value)


def test_a_sources_list_loads_from_toml(tmp_path):
    from runtime.config import load

    f = tmp_path / "e.toml"
    f.write_text('[[sources]]\nname = "line1"\nrate_hz = 5\n'
                 '[[sources]]\nname = "line2"\nkind = "capture"\npath = "rtsp://cam2/s"\n'
                 'rate_hz = 15\nroi = [0.25, 0, 0.5, 1]\nroi_units = "fraction"\n'
                 'open_timeout_s = 3\n')
    cfg = load(f)
    assert [s.name for s in cfg.sources] == ["line1", "line2"]
    assert cfg.sources[1].roi == (0.25, 0, 0.5, 1) and cfg.sources[1].open_timeout_s == 3


# -- a real pipeline with three sources -----------------------------------------------------


def test_three_sources_share_one_session_each_result_names_its_source(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i, s in enumerate(samples(seed=3, count=6)):
        cv2.imwrite(str(inbox / f"p{i}.png"), s.image)
        (inbox / f"p{i}.png").touch()
    old = time.time() - 10
    for f in inbox.iterdir():  # settled files (the folder source waits 1 s otherwise)
        os.utime(f, (old, old))
    cfgs = [SourceConfig(name="fast", rate_hz=200, size=64),
            SourceConfig(name="slow", rate_hz=5, size=64, seed=1),
            SourceConfig(name="files", kind="folder", path=str(inbox), rate_hz=50)]
    m, backend, v = tiny_variant(tmp_path)
    out: list[dict] = []
    events: list[dict] = []
    p = Pipeline(lanes(cfgs, lambda c, i: open_source(c, tmp_path / "state")), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), events.append)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                sum(r["source"] == "slow" for r in out) >= 5
                and sum(r["source"] == "files" for r in out) == 6):
            time.sleep(0.05)
        stats = p.stats()
    finally:
        p.stop()
    assert {t.name for t in p._threads} >= {"capture-fast", "capture-slow", "capture-files"}
    by = {name: [r for r in out if r["source"] == name] for name in ("fast", "slow", "files")}
    assert sorted(r["ref"] for r in by["files"]) == [f"p{i}.png" for i in range(6)]  # all
    assert len(by["slow"]) >= 5 and len(by["fast"]) > 3 * len(by["slow"])
    src = stats["sources"]
    assert set(src) == {"fast", "slow", "files"}
    assert src["files"]["results"] == 6 and src["files"].get("dropped_stale", 0) == 0
    assert all(s["state"] == "running" and s["e2e_p95_ms"] is not None for s in src.values())
    assert 2 <= src["slow"]["rate_hz"] <= 8  # paced by its synthetic source at 5 Hz
    assert not [e for e in events if e["type"] in ("source_failed", "inference_failed")]


# -- the daemon ------------------------------------------------------------------------------

pytestmark_daemon = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                       reason="bundled model not built")


def _four_cameras(tmp_path: Path, window_s: float) -> tuple[dict[str, list[float]], dict]:
    """`edgerun serve` with four synthetic cameras at 10 Hz on the bundled model and a 20 ms
    target: each camera's capture-to-result latencies (ms) over `window_s` of steady state,
    and the last health. The first seconds after READY are left out: the conveyors' shared
    pool renders one part per frame drawn (256 parts at 40 Hz: ~6.4 s) and the preprocessing
    path is measured then; the bench measures without them."""
    sources = "\n".join(f'[[sources]]\nname = "cam{i}"\nkind = "synthetic"\nrate_hz = 10\n'
                        f'seed = {i}\nsize = 32' for i in range(4))
    cfg = write_config(tmp_path, tmp_path / "cache", source="kind = \"synthetic\"",
                       latency_ms=20.0)
    cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n', sources + "\n"))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: d.ready(), 180, "ready", d)
        time.sleep(8.0)
        settled = time.time()
        # one read at the end: polling the outbox (parsing every result) every 50 ms would
        # compete with the daemon for the two cores and show up in its latencies
        time.sleep(window_s)
        by: dict[str, list[float]] = {}
        for r in results(d.outbox):
            if r["t"] >= settled:
                by.setdefault(r["source"], []).append(r["e2e_ms"])
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    assert sorted(by) == ["cam0", "cam1", "cam2", "cam3"]
    assert min(map(len, by.values())) >= 6 * window_s, {k: len(v) for k, v in by.items()}
    return by, h


@pytestmark_daemon
@pytest.mark.overhead_guard
def test_serve_with_four_sources_names_them_and_plans_for_their_combined_rate(tmp_path):
    """Every result names its camera; health reports each one's state, rate and p95; the
    choice is made for 4 streams at 40 Hz combined; each camera's median frame is well
    within the 20 ms target (the p95 over a long window: the test below and the bench; a
    6 s window on this shared machine is at the mercy of other work's stalls). A latency
    judged against a fixed target, so it runs alone (marker overhead_guard, as the test
    below): beside two busy loops on 2 cores one camera's median read 25.5 ms in 1 of 3
    runs (the others 0.8-9.3 ms; 2026-12-08), the daemon's inference thread given half a
    core."""
    by, h = _four_cameras(tmp_path, 6.0)
    assert all(float(np.median(ms)) <= 20.0 for ms in by.values()), \
        {k: float(np.median(v)) for k, v in by.items()}
    srcs = h["pipeline"]["sources"]
    assert sorted(srcs) == ["cam0", "cam1", "cam2", "cam3"]
    for name, s in srcs.items():
        assert s["state"] == "running" and s["e2e_p95_ms"] > 0 and s["backlog"] >= 0, (name, s)
        assert 5 <= s["rate_hz"] <= 15, (name, s)  # each at its own 10 Hz
    assert "4 sources at 40 Hz combined" in h["choice_reason"]
    # 20 ms / 4 streams: each inference must take <= 5 ms (40 Hz at 80 % would allow 20 ms)
    assert "p95 <= 5 ms" in h["choice_reason"]
    assert math.isclose(sum(s["rate_hz"] for s in srcs.values()), 40, rel_tol=0.3)


@pytestmark_daemon
@pytest.mark.overhead_guard
def test_serve_with_four_sources_keeps_each_streams_p95_within_target(tmp_path):
    """Four cameras on the bundled model, each camera's p95 (capture to stored result) within
    the 20 ms target over 30 s of steady state. A latency judged against a fixed target, so
    it runs alone (marker overhead_guard: `.ci/run`'s first step): beside the suite's other
    worker, in the slow tier, cam3 read 21.0 ms at load 7-10 (15-17 ms the others)."""
    by, _ = _four_cameras(tmp_path, 30.0)
    p95 = {name: float(np.percentile(ms, 95)) for name, ms in by.items()}
    print(f"p95 per camera (ms): {p95}, load {os.getloadavg()[0]:.1f}")
    assert all(v <= 20.0 for v in p95.values()), p95


def test_results_of_a_single_source_are_named_main(tmp_path):
    src = Path(tmp_path)
    cfg = SourceConfig(rate_hz=50, size=64)
    m, backend, v = tiny_variant(src)
    out: list[dict] = []
    p = Pipeline(lambda: open_source(cfg, src / "state"), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), lambda e: None)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        deadline = time.monotonic() + 10
        while len(out) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = p.stats()
    finally:
        p.stop()
    assert len(out) >= 5 and {r["source"] for r in out} == {"main"}
    assert list(stats["sources"]) == ["main"] and p._threads[0].name == "capture"


class _Camera(http.server.BaseHTTPRequestHandler):
    """An HTTP MJPEG camera that sends 20 frames (64x48, 20 ms apart) per connection and
    hangs up: every connection is a stream that runs briefly and then fails."""

    frames = 20

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        _, jpg = cv2.imencode(".jpg", np.full((48, 64, 3), 200, np.uint8))
        try:
            for _ in range(self.frames):
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                                 + str(len(jpg)).encode() + b"\r\n\r\n" + jpg.tobytes()
                                 + b"\r\n")
                self.wfile.flush()
                time.sleep(0.02)
        except OSError:
            pass


@pytestmark_daemon
def test_a_failing_camera_is_retried_while_the_other_sources_go_on(tmp_path):
    """`edgerun serve` with an MJPEG camera that keeps hanging up (a real HTTP server) and a
    synthetic conveyor: the camera's failures are events naming it and retried with backoff,
    its frames (cropped to its ROI) are inspected between failures, and the conveyor's
    results never stop; the health and events are ones the coordinator admits."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/cam.mjpg"
    sources = (f'[[sources]]\nname = "door"\nkind = "capture"\npath = "{url}"\nrate_hz = 20\n'
               'roi = [0, 0, 0.5, 0.5]\nroi_units = "fraction"\nread_timeout_s = 2\n'
               '[[sources]]\nname = "belt"\nkind = "synthetic"\nrate_hz = 10\nsize = 32\n')
    cfg = write_config(tmp_path, tmp_path / "cache", source="kind = \"synthetic\"")
    cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n', sources))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(events(d.outbox, "source_failed")) >= 3, 120, "three camera failures",
             d)
        n_belt = sum(r["source"] == "belt" for r in results(d.outbox))
        time.sleep(1.5)
        rs = results(d.outbox)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
        srv.shutdown()
        srv.server_close()
    failed = events(d.outbox, "source_failed")
    assert {e["source"] for e in failed} == {"door"}
    retries = [e["retry_s"] for e in failed[:3]]  # the documented backoff, jittered: a
    # camera's is capped at 2 s (runtime/frames/multisource.py retry_cap_s)
    assert all(c / 2 - 0.05 <= r <= c + 0.05
               for r, c in zip(retries, [0.5, 1, 2], strict=True)), retries
    assert sum(r["source"] == "door" for r in rs) >= 10  # inspected between the failures
    assert sum(r["source"] == "belt" for r in rs) >= n_belt + 8  # ~15 in 1.5 s at 10 Hz
    assert h["pipeline"]["sources"]["door"]["source_errors"] >= 3
    assert h["pipeline"]["sources"]["belt"]["state"] == "running"
    assert h["pipeline"]["frames_bad"]["roi_outside"] == 0
    assert "source door failed" in d.text()


@pytestmark_daemon
def test_results_at_the_coordinator_name_their_source(tmp_path):
    """Through Mosquitto to a coordinator: each stored result says which camera it is from
    (the field is declared in the result schema; an undeclared one would be quarantined)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire.broker import Mosquitto

    broker = Mosquitto(tmp_path).start()
    coord = Coordinator(CoordinatorConfig(fleet="t", broker=broker.coordinator("t"),
                                          store=str(tmp_path / "coord.db")))
    coord.start()
    d = None
    try:
        assert coord.connected.wait(30)
        creds = broker.device("t", "box1")
        extra = (f'[telemetry.broker]\nhost = "127.0.0.1"\nport = {broker.port}\n'
                 f'username = "{creds.username}"\npassword_file = "{creds.password_file}"\n')
        sources = ('[[sources]]\nname = "left"\nrate_hz = 10\nsize = 32\n'
                   '[[sources]]\nname = "right"\nrate_hz = 10\nsize = 32\nseed = 1\n')
        cfg = write_config(tmp_path, tmp_path / "cache", source="kind = \"synthetic\"",
                           extra=extra)
        cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n', sources))
        d = Serve(tmp_path, cfg)
        wait(lambda: coord.store.counts().get("box1", 0) >= 30, 120, "results stored", d)
        stored = coord.store.results("box1", 0, 1000)
    finally:
        if d is not None:
            assert d.stop() == 0
        coord.stop()
        broker.stop()
    assert {r["source"] for r in stored} == {"left", "right"}
    assert all(r["ref"].startswith("part-") for r in stored)


def test_a_combined_rate_cap_is_shared_by_rate_and_other_kinds_are_paced(tmp_path):
    """The control loop's cap is for the box: 8 Hz over a 10 Hz and a 30 Hz camera gives them
    2 and 6 Hz. A folder source in [[sources]] is inspected at its own rate_hz."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    old = time.time() - 10
    for i, s in enumerate(samples(seed=4, count=8)):
        cv2.imwrite(str(inbox / f"f{i}.png"), s.image)
    for f in inbox.iterdir():
        os.utime(f, (old, old))
    m, active = tiny_active(tmp_path)
    cams = [SourceConfig(name="a", rate_hz=10, size=32), SourceConfig(name="b", rate_hz=30,
                                                                      size=32, seed=1)]
    out: list[dict] = []
    p = Pipeline(lanes(cams, lambda c, i: open_source(c, tmp_path / "state")), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), lambda e: None)
    p.rate_cap_hz = 8.0
    p.start(active)
    try:
        time.sleep(1.0)
        n0 = {k: sum(r["source"] == k for r in out) for k in ("a", "b")}
        time.sleep(4.0)
        n1 = {k: sum(r["source"] == k for r in out) for k in ("a", "b")}
    finally:
        p.stop()
    rate = {k: (n1[k] - n0[k]) / 4.0 for k in ("a", "b")}
    assert 1.2 <= rate["a"] <= 2.8 and 4.5 <= rate["b"] <= 7.0, rate  # 2 and 6 Hz
    m, active = tiny_active(tmp_path)
    files = [SourceConfig(name="files", kind="folder", path=str(inbox), rate_hz=5)]
    got: list[tuple[float, str]] = []
    p = Pipeline(lanes(files, lambda c, i: open_source(c, tmp_path / "state")), m,
                 lambda rs: got.extend((time.monotonic(), r["ref"]) for r in rs)
                 or list(range(len(rs))), lambda e: None)
    p.start(active)
    try:
        deadline = time.monotonic() + 20
        while len(got) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.stop()
    assert sorted(ref for _, ref in got) == [f"f{i}.png" for i in range(8)]
    assert got[-1][0] - got[0][0] >= 7 / 5 * 0.8  # 8 files at 5 Hz: ~1.4 s, not at once


class _LongCamera(_Camera):
    frames = 150  # 3 s at 50 fps


def test_a_camera_faster_than_its_rate_is_read_fresh_and_inspected_at_its_rate(tmp_path):
    """A 50 fps camera inspected at 10 Hz: every frame is read (the stream's buffer must not
    fill with ever older frames) and one in five is handed over; the others are counted as
    skipped (`skipped_latest`: the reader paces itself at the rate and passes them over
    unconverted; `skipped_rate`: the lane's pacer), not as dropped or bad."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LongCamera)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/cam.mjpg"
    m, active = tiny_active(tmp_path)
    cams = [SourceConfig(name="door", kind="capture", path=url, rate_hz=10)]
    out: list[dict] = []
    p = Pipeline(lanes(cams, lambda c, i: open_source(c, tmp_path / "state")), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), lambda e: None)
    p.start(active)
    try:
        deadline = time.monotonic() + 20
        while p.stats()["sources"]["door"].get("source_errors", 0) == 0 \
                and time.monotonic() < deadline:  # until the camera hangs up, ~3 s
            time.sleep(0.05)
        stats = p.stats()["sources"]["door"]
    finally:
        p.stop()
        srv.shutdown()
        srv.server_close()
    assert 20 <= stats["frames"] <= 40, stats  # ~3 s at 10 Hz
    # every frame was read: passed over by the reader pacing itself at the rate (skipped_latest)
    # or by the lane's pacer
    assert stats["frames"] + stats.get("skipped_rate", 0) + stats.get("skipped_latest", 0) >= 140, \
        stats
    assert stats.get("dropped_stale", 0) <= 2 and len(out) == stats["results"]


@pytest.mark.parametrize(("cfg", "hz"), [
    # a camera or stream: at its rate_hz, as a [[sources]] entry (0: as fast as it comes)
    (SourceConfig(kind="capture", path="rtsp://cam1/s", rate_hz=2), 2.0),
    (SourceConfig(kind="capture", path="http://cam1/c.mjpg", decoder="opencv", rate_hz=5), 5.0),
    (SourceConfig(kind="capture", path="0"), 10.0),  # a V4L2 device at the default rate
    (SourceConfig(kind="capture", path="rtsp://cam1/s", rate_hz=0), 0.0),
    (SourceConfig(kind="pylon", rate_hz=4), 4.0),  # free-running
    # a video file's lane carries the rate too; it is not live, so not paced (a test below)
    (SourceConfig(kind="capture", path="/srv/line.avi", rate_hz=2), 2.0),
    # their own pace: the line's (a PLC's edges, MQTT), a backlog, the conveyor's own
    (SourceConfig(kind="capture", path="rtsp://cam1/s", trigger="opcua", rate_hz=2), 0.0),
    (SourceConfig(kind="pylon", trigger="modbus", rate_hz=2), 0.0),
    (SourceConfig(kind="synthetic", trigger="modbus", rate_hz=2), 0.0),
    (SourceConfig(kind="trigger", topic="line/img", rate_hz=2), 0.0),
    (SourceConfig(kind="folder", path="/srv/in", rate_hz=2), 0.0),
    (SourceConfig(kind="synthetic", rate_hz=2), 0.0),  # paces itself at it
])
def test_a_single_source_is_paced_at_its_rate_hz_where_it_is_a_camera(cfg, hz):
    assert single_pace_hz(cfg) == hz
    (lane,) = single(cfg, lambda: None)
    assert lane.pace_hz == hz and not lane.pace_not_live


def test_a_single_camera_faster_than_its_rate_is_inspected_at_its_rate(tmp_path):
    """`[source]` as a `[[sources]]` entry (the test above): a 50 fps camera at rate_hz = 10
    is read whole and one frame in five inspected, the others counted as skipped."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LongCamera)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/cam.mjpg"
    m, active = tiny_active(tmp_path)
    cfg = SourceConfig(kind="capture", path=url, rate_hz=10)
    p = Pipeline(single(cfg, lambda: open_source(cfg, tmp_path / "state")), m,
                 lambda rs: list(range(len(rs))), lambda e: None)
    p.start(active)
    try:
        wait(lambda: p.stats()["sources"]["main"].get("source_errors", 0) > 0, 20,
             "the camera hanging up, ~3 s")
        stats = p.stats()["sources"]["main"]
    finally:
        p.stop()
        srv.shutdown()
        srv.server_close()
    assert 20 <= stats["frames"] <= 40, stats  # ~3 s at 10 Hz, not 150 frames
    assert stats["frames"] + stats.get("skipped_rate", 0) + stats.get("skipped_latest", 0) \
        >= 140, stats


def test_a_single_video_file_is_inspected_frame_by_frame_not_at_its_rate(tmp_path):
    """A video file under `[source]` is not live: every frame is inspected, as fast as the
    pipeline takes them (a recording replayed, docs/daemon.md), not at rate_hz."""
    video = tmp_path / "line.avi"
    w = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(20):
        w.write(np.full((48, 64, 3), i * 10, np.uint8))
    w.release()
    m, active = tiny_active(tmp_path)
    cfg = SourceConfig(kind="capture", path=str(video), rate_hz=2)
    out: list[dict] = []
    ended: list[dict] = []
    p = Pipeline(single(cfg, lambda: open_source(cfg, tmp_path / "state")), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))),
                 lambda e: ended.append(e) if e["type"] == "source_ended" else None)
    t0 = time.monotonic()
    p.start(active)
    try:
        wait(lambda: ended and len(out) == 20, 20, "the file's 20 results")
        took = time.monotonic() - t0
        stats = p.stats()["sources"]["main"]
    finally:
        p.stop()
    # paced at 2 Hz its 20 frames would take 9.5 s
    assert took < 4.0, f"20 frames took {took:.1f} s"
    assert "skipped_rate" not in stats and "skipped_latest" not in stats, stats


def test_printed_results_say_which_camera():
    from runtime.frames.results_local import print_line

    r = {"t": 1.7e9, "ref": "part-12", "label": "ok", "score": 0.9, "variant": "v", "rung": 1}
    assert print_line({**r, "source": "line1-top"}).split()[1] == "line1-top/part-12"
    assert print_line({**r, "source": "main"}).split()[1] == "part-12"  # one unnamed source
    assert len(print_line({**r, "source": "line1-top"}).split()) == 7  # the six fields


def test_each_outages_back_again_line_counts_its_own_failures(tmp_path, caplog):
    """A camera that hangs up after every 20 frames (the real HTTP server above): each
    hang-up is one outage of one failure (the re-open works at once), and its "delivers
    again" line says so. It said the backoff's count, which runs on across outages until a
    source has run 60 s: 1, 2, 3 ... attempts for outages of one failure each."""
    import logging

    from runtime.frames.multisource import single

    caplog.set_level(logging.INFO, logger="edgerun.pipeline")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = SourceConfig(kind="capture", path=f"http://127.0.0.1:{srv.server_address[1]}/c.mjpg",
                       read_timeout_s=2, decoder="opencv")
    m, active = tiny_active(tmp_path)
    p = Pipeline(single(cfg, lambda: open_source(cfg, tmp_path / "state")), m,
                 lambda rs: list(range(len(rs))), lambda e: None)
    p.start(active)

    def back() -> list[str]:
        return [r.getMessage() for r in list(caplog.records)
                if "delivers again" in r.getMessage()]
    try:
        wait(lambda: len(back()) >= 3, 60, "three returns after hang-ups")
        stats = p.stats()["sources"]["main"]
    finally:
        p.stop()
        srv.shutdown()
        srv.server_close()
    lines = back()
    assert stats["outages"] >= 3, stats
    assert all(line.endswith("(1 failure)") for line in lines), lines
