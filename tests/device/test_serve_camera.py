"""`edgerun serve` against a real IP camera: GStreamer's RTSP server serving live 720p H.264
(tests/support/rtsp_camera.py), the whole daemon from its config file to the outbox. The
frame path's tests drive a Pipeline; this one is what an operator runs: the camera's URL,
`frame_size`, the camera rebooting under the daemon, and the daemon's own words about it."""

from __future__ import annotations

import time
import urllib.request

import pytest
from support.daemon_harness import Serve, events, last_health, results, write_config
from support.rtsp_camera import RtspCamera, skip_reason
from support.waiting import wait
from support.web import gauges

from models import bundled
from runtime.frames.multisource import CAMERA_RETRY_CAP_S
from runtime.wire.broker import free_port

pytestmark = [
    pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok"),
    pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                       reason="bundled model not built"),
]


def _made(port: int) -> float:
    """Results the daemon has made (its local API's /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return gauges(r.read().decode()).get("edgerun_device_results_total", 0.0)


def test_serve_inspects_a_live_camera_and_is_back_within_5_s_of_its_reboot(
        tmp_path, tmp_path_factory):
    port = free_port()
    (tmp_path / "camera").mkdir()
    with RtspCamera(tmp_path / "camera", width=1280, height=720) as cam:
        cfg = write_config(
            tmp_path, tmp_path_factory.mktemp("profiles"),
            source=f'kind = "capture"\npath = "{cam.url}"\nread_timeout_s = 2\n'
                   f"frame_size = [192, 108]",
            extra=f"[local_api]\nport = {port}\n")
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and _made(port) >= 20, 120, "results from the camera", d)
            cam.kill()
            wait(lambda: "source failed: " in d.text(), 30, "the daemon noticing the camera "
                 "gone", d)
            time.sleep(6)  # a camera rebooting: long enough for a doubling backoff to grow
            before = _made(port)
            cam.start()  # back on the same port
            back = time.monotonic()
            wait(lambda: _made(port) > before, 30, "results after the reboot", d)
            again_s = time.monotonic() - back
            assert d.stop() == 0
        finally:
            d.stop()
    text = d.text()
    assert "Traceback" not in text, text[-3000:]
    assert "stretched" not in text  # 192x108 is the camera's shape
    assert "preprocessing 192x108->" in text  # the frames the model saw were frame_size's
    # the camera's retry cap, said by the daemon: with the 30 s cap of a folder the timing
    # below still passed 3 times in 4 (jittered delays of 2-4 and 4-8 s around the 6 s
    # outage), so it alone does not show a rebooted camera is met within seconds
    assert f"backing off to at most {CAMERA_RETRY_CAP_S:g} s" in text
    assert again_s <= 5.0, f"results {again_s:.1f} s after the camera was back"
    made = results(d.outbox)
    assert len(made) >= 20 and {r["source"] for r in made} == {"main"}
    failed = events(d.outbox, "source_failed")
    assert len(failed) == 1, failed  # one outage, one event


def test_a_refused_password_is_retried_slowly_not_every_2_s(tmp_path, tmp_path_factory):
    """A camera that answers 401 is up: retrying it every 2 s, as a camera that is down,
    is a failed login every 2 s, and many cameras lock the account (for every client of it,
    the NVR's too) after a handful of them. The daemon says the refusal once and tries
    again only after AUTH_RETRY_S."""
    from runtime.frames.multisource import AUTH_RETRY_S

    port = free_port()
    (tmp_path / "camera").mkdir()
    with RtspCamera(tmp_path / "camera", width=320, height=180, user="op",
                    password="right") as cam:
        cfg = write_config(
            tmp_path, tmp_path_factory.mktemp("profiles"),
            source=f'kind = "capture"\npath = "{cam.url_with("op", "stale")}"\n'
                   'decoder = "pyav"\nopen_timeout_s = 2',
            extra=f"[local_api]\nport = {port}\n")
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and "refused the credentials" in d.text(), 120,
                 "the refusal", d)
            time.sleep(8)  # four attempts at the camera cap of 2 s
            h = last_health(d.outbox)
            assert d.stop() == 0
        finally:
            d.stop()
    text = d.text()
    assert "stale" not in text and "right" not in text.replace("the right one", "")
    assert h is not None
    assert h["pipeline"]["sources"]["main"]["source_errors"] == 1, h["pipeline"]["sources"]
    assert f"retrying in {AUTH_RETRY_S:.1f} s" in text
    assert len(events(d.outbox, "source_failed")) == 1


def test_two_cameras_one_dies_the_other_keeps_its_rate_and_health_says_which(
        tmp_path, tmp_path_factory):
    """Two `[[sources]]` cameras at 5 Hz each; one is killed. The other keeps its 5 Hz, and
    health's per-source rate of the dead one falls to nothing at once: it is what a
    dashboard alerts on (it read its old 5 Hz until its last frame left the 30 s window)."""
    port = free_port()
    (tmp_path / "camera").mkdir()
    with RtspCamera(tmp_path / "camera", width=320, height=180, name="a") as a, \
            RtspCamera(tmp_path / "camera", width=320, height=180, name="b") as b:
        lanes = "".join(
            f'[[sources]]\nname = "{n}"\nkind = "capture"\npath = "{c.url}"\nrate_hz = 5\n'
            "read_timeout_s = 2\nopen_timeout_s = 2\n" for n, c in (("a", a), ("b", b)))
        cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                           extra=f"[local_api]\nport = {port}\n{lanes}")
        # [[sources]] replaces the harness's synthetic [source]
        text = cfg.read_text()
        start = text.index("[source]\n")
        end = text.index("\n[", start + 1) + 1
        cfg.write_text(text[:start] + text[end:])
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and _made(port) >= 30, 120, "results from both", d)
            a.kill()
            wait(lambda: "source a failed" in d.text(), 30, "camera a failing", d)
            seen = {s: sum(1 for r in results(d.outbox) if r["source"] == s) for s in "ab"}
            time.sleep(6)
            h = last_health(d.outbox)
            after = {s: sum(1 for r in results(d.outbox) if r["source"] == s) for s in "ab"}
            assert d.stop() == 0
        finally:
            d.stop()
    assert "Traceback" not in d.text()
    assert after["a"] == seen["a"]
    assert after["b"] - seen["b"] >= 0.8 * 5 * 6, (seen, after)  # b kept its 5 Hz
    assert h is not None
    sources = h["pipeline"]["sources"]
    assert sources["a"]["state"] == "failed" and sources["a"]["down_s"] >= 4
    # its frames' count over the time since the first of them (8+ s, most without a frame),
    # not over the span between its first and last frame
    assert sources["a"]["rate_hz"] < 2.5, sources["a"]
    assert 4.0 <= sources["b"]["rate_hz"] <= 6.0, sources["b"]
