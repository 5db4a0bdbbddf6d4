"""Sources on their own: the MQTT trigger against Mosquitto, a capture from a video file, the
region of interest, and RTSP/HTTP streams against real local servers (MJPEG over HTTP, a
minimal RTSP responder, a silent port)."""

from __future__ import annotations

import http.server
import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from support.tiny_ort import tiny_active
from support.under_test import child_env

from models.synthetic import samples
from runtime.config import ConfigError, from_dict
from runtime.config.source import SourceConfig
from runtime.frames import roi
from runtime.frames.capture_source import CaptureSource, stalled
from runtime.frames.frame import BadFrame, SourceEnded, SourceError
from runtime.frames.multisource import single
from runtime.frames.pipeline import Pipeline
from runtime.frames.sources import open_source
from runtime.wire.broker import Mosquitto

ROOT = Path(__file__).parents[2]


def _read(src, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        f = src.read(0.2)
        if f is not None:
            return f
    return None


def test_trigger_source_takes_image_bytes_and_paths_and_skips_garbage(tmp_path):
    broker = Mosquitto(tmp_path).start()
    try:
        cfg = SourceConfig(kind="trigger", topic="plc/line1/trigger")
        # the device may read its trigger topic; the camera (a plain client) may write it
        src = open_source(cfg, tmp_path, broker.device("f", "t", read=(cfg.topic,)), "t")
        # the SUBACK (was: a 0.5 s sleep; a trigger published before the SUBSCRIBE is lost)
        assert src._conn.subscribed.wait(30), "the trigger source never subscribed"
        img = next(samples(seed=1, count=1)).image
        _, png = cv2.imencode(".png", img)
        path = tmp_path / "part.png"
        cv2.imwrite(str(path), img)
        camera = broker.client("camera", write=(cfg.topic,))
        pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        pub.username_pw_set(camera.username, Path(camera.password_file).read_text().strip())
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        for payload in (png.tobytes(), b"\x00garbage", str(path).encode()):
            pub.publish(cfg.topic, payload, qos=1).wait_for_publish(5)
        first = _read(src)
        assert first is not None and np.array_equal(first.image, img)
        with pytest.raises(BadFrame) as bad:  # the garbage trigger is refused, and says so
            _read(src)
        assert bad.value.kind == "undecodable" and bad.value.ref == "trigger-2"
        second = _read(src)  # the path one arrives
        assert second is not None and np.array_equal(second.image, img)
        assert src.live is False  # triggers are never dropped as stale
        pub.loop_stop()
        src.close()
    finally:
        broker.stop()


def test_capture_source_reads_a_video_file_then_reports_its_end(tmp_path):
    path = tmp_path / "line.avi"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 96))
    for s in samples(seed=2, count=5):
        w.write(s.image)
    w.release()
    src = CaptureSource(SourceConfig(kind="capture", path=str(path)))
    frames = [src.read(0.5) for _ in range(5)]
    assert all(f is not None and f.image.shape == (96, 96, 3) for f in frames)
    assert src.live is False  # a file is not a live camera
    with pytest.raises(SourceEnded, match="end of the video file after 5 frames"):
        src.read(0.5)
    src.close()
    with pytest.raises(SourceError, match="cannot open"):
        CaptureSource(SourceConfig(kind="capture", path=str(tmp_path / "missing.avi")))


# -- region of interest ----------------------------------------------------------------------

def test_roi_resolves_pixels_and_fractions_and_names_the_key_when_it_does_not_fit():
    assert roi.resolve([10, 20, 30, 40], "pixels", 640, 480) == roi.Rect(10, 20, 30, 40)
    assert roi.resolve([0.5, 0.25, 0.5, 0.5], "fraction", 640, 480) == roi.Rect(320, 120, 320,
                                                                                  240)
    assert roi.resolve((), "pixels", 64, 48) == roi.Rect(0, 0, 64, 48)  # no ROI: the frame
    with pytest.raises(roi.RoiError, match=r"\[source\] roi = \[600, 0, 100, 10\] \(pixels\): "
                       r"reaches to x 700, y 10, outside the 640x480 frame"):
        roi.resolve([600, 0, 100, 10], "pixels", 640, 480, "[source] roi")
    with pytest.raises(roi.RoiError, match="less than one pixel of the 10x10 frame"):
        roi.resolve([0.5, 0.5, 0.01, 0.01], "fraction", 10, 10)
    # shape problems are caught on their own (config load), each saying what is expected
    assert "4 values" in roi.check([1, 2, 3], "pixels")
    assert "whole numbers" in roi.check([0, 0, 0.5, 0.5], "pixels")
    assert "<= 1" in roi.check([0.5, 0, 0.6, 0.5], "fraction")
    assert "w and h > 0" in roi.check([0, 0, 0, 0.5], "fraction")
    assert roi.check([0, 0, 1, 1], "fraction") is None


def test_roi_crop_is_the_rectangle_and_boxes_map_back_to_the_frame():
    img = np.arange(48 * 64 * 3, dtype=np.uint32).reshape(48, 64, 3).astype(np.uint8)
    rect = roi.resolve([8, 4, 16, 12], "pixels", 64, 48)
    out = roi.crop(img, rect)
    assert out.shape == (12, 16, 3) and np.array_equal(out, img[4:16, 8:24])
    # a box covering the whole ROI is the ROI, in frame-normalised coordinates
    assert roi.to_frame((0, 0, 1, 1), rect, 64, 48) == (8 / 64, 4 / 48, 16 / 64, 12 / 48)


@pytest.mark.parametrize("w, h, size, says", [
    (1280, 720, (224, 126), None),  # the camera's shape (16:9 within 2 %)
    (1280, 720, (), None),  # no frame_size: nothing converted
    (1280, 720, (224, 224), "stretched 0.56x"),
    (640, 480, (224, 126), "stretched 1.33x"),
    (0, 480, (224, 126), None),  # no size known
])
def test_a_frame_size_of_another_shape_is_said(w, h, size, says):
    from runtime.frames.frame_shape import stretched

    got = stretched(w, h, size)
    assert (got is None) if says is None else (says in (got or "")), got


@pytest.mark.parametrize(("section", "key", "expected"), [
    ({"roi": [0, 0, 0.5, 0.5]}, "source.roi", "whole numbers"),
    ({"roi": [0, 0, 100, 10]}, "source.roi", "outside the 96x96 frame"),  # synthetic: known
    ({"roi": [0.2, 0.2, 0.9, 0.5], "roi_units": "fraction"}, "source.roi", "<= 1"),
    ({"name": "cam 1"}, "source.name", "letters, digits"),
    ({"kind": "capture", "path": "rtsp://x/y", "open_timeout_s": 0}, "source.open_timeout_s",
     "must be > 0"),
    ({"kind": "capture", "path": "rtsp://x/y", "transport": "sctp"}, "source.transport",
     "'tcp' or 'udp' or 'auto'"),
    ({"kind": "capture", "path": "rtsp://x/y", "decoder": "gst"}, "source.decoder",
     "'auto' or 'opencv' or 'pyav'"),
    # edgerun's own RTSP client: rtsp:// over TCP only (the path, credentials and all, unsaid)
    ({"kind": "capture", "path": "http://u:pw1@x/y", "decoder": "rtp"}, "source.decoder",
     "scheme 'http'"),
    ({"kind": "capture", "path": "rtsp://x/y", "decoder": "rtp", "transport": "udp"},
     "source.decoder", "over TCP"),
    ({"frame_size": [224, 126]}, "source.frame_size", "a capture source"),
    ({"kind": "capture", "path": "rtsp://x/y", "frame_size": [224]}, "source.frame_size",
     "[width, height]"),
    ({"kind": "capture", "path": "rtsp://x/y", "frame_size": [224, 8]}, "source.frame_size",
     "within 16..8192"),
    ({"kind": "capture", "path": "rtsp://x/y", "frame_size": [224, 126.5]},
     "source.frame_size.[1]", "expected an integer"),
    ({"kind": "capture", "path": "rtsp://x/y", "frame_size": [224, 126], "roi": [0, 0, 10, 10]},
     "source.roi_units", '"fraction" with frame_size'),
])
def test_bad_source_settings_are_refused_naming_the_key(section, key, expected):
    with pytest.raises(ConfigError, match=rf"key '{re.escape(key)}'.*{re.escape(expected)}"):
        from_dict({"source": section})


class _Recorder:
    """The manifest's own preprocessing, recording the image each frame handed to it."""

    def __init__(self, manifest):
        self._apply = manifest.preprocess.apply
        self.seen: list[np.ndarray] = []

    def __call__(self, image, shape):
        self.seen.append(np.array(image))
        return self._apply(image, shape)


def _video(path: Path, frames: int, size=(64, 48)) -> Path:
    """Frames whose left half is black and right half white (the ROI picks one)."""
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, size)
    img = np.zeros((size[1], size[0], 3), np.uint8)
    img[:, size[0] // 2:] = 255
    for _ in range(frames):
        w.write(img)
    w.release()
    return path


def _until(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_pipeline_crops_the_roi_before_preprocessing(tmp_path):
    video = _video(tmp_path / "v.avi", 6)
    m, active = tiny_active(tmp_path)
    rec = _Recorder(m)
    results: list[dict] = []
    cfg = SourceConfig(kind="capture", path=str(video), roi=(32, 8, 24, 32), name="cam1")
    p = Pipeline(single(cfg, lambda: open_source(cfg, tmp_path)), m,
                 lambda rs: results.extend(rs) or list(range(len(rs))), lambda e: None,
                 preprocess=rec)
    p.start(active)
    try:
        _until(lambda: len(results) == 6, 20, "six results")
    finally:
        p.stop()
    # the model saw only the ROI: 32x24 pixels of the white half, nothing of the black one
    assert {im.shape for im in rec.seen} == {(32, 24, 3)}
    assert all(im.min() > 200 for im in rec.seen)
    assert {r["source"] for r in results} == {"cam1"}


def test_frames_the_roi_does_not_fit_are_counted_and_reported_naming_the_key(tmp_path):
    video = _video(tmp_path / "v.avi", 4)  # 64x48 frames
    m, active = tiny_active(tmp_path)
    results: list[dict] = []
    events: list[dict] = []
    cfg = SourceConfig(kind="capture", path=str(video), roi=(0, 0, 100, 48))
    p = Pipeline(single(cfg, lambda: open_source(cfg, tmp_path)), m,
                 lambda rs: results.extend(rs) or list(range(len(rs))), events.append)
    p.start(active)
    try:
        _until(lambda: any(e["type"] == "source_ended" for e in events), 20, "the end")
        stats = p.stats()
    finally:
        p.stop()
    assert results == [] and stats["frames_bad"]["roi_outside"] == 4
    (bad,) = [e for e in events if e["type"] == "frame_bad"]  # rate-limited: once
    assert bad["kind"] == "roi_outside"
    assert "[source] roi = [0, 0, 100, 48] (pixels): reaches to x 100, y 48, outside " \
           "the 64x48 frame" in bad["error"]


# -- RTSP / HTTP streams ---------------------------------------------------------------------

@pytest.fixture
def mjpeg_server():
    """An HTTP MJPEG camera (multipart/x-mixed-replace, as IP cameras serve it): `frames`
    JPEGs 20 ms apart, then it stalls with the connection open for `stall_s`."""
    conf = {"frames": 10, "stall_s": 30.0}

    class Camera(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            try:
                for i in range(conf["frames"]):
                    _, jpg = cv2.imencode(".jpg", np.full((48, 64, 3), 20 * i, np.uint8))
                    self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                                     + str(len(jpg)).encode() + b"\r\n\r\n" + jpg.tobytes()
                                     + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.02)
                time.sleep(conf["stall_s"])
            except OSError:
                pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Camera)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/video.mjpg", conf
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never says anything (a hung camera)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    conns = []

    def accept():
        while True:
            try:
                conns.append(s.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield s.getsockname()[1]
    s.close()
    for c in conns:
        c.close()


def test_an_http_mjpeg_stream_is_read_then_a_stall_fails_within_the_read_timeout(mjpeg_server):
    url, _ = mjpeg_server
    src = CaptureSource(SourceConfig(kind="capture", path=url, read_timeout_s=1.0))
    assert src.live  # a stream, not a file
    # a live source serves the newest frame: each of the 10 sent is served or counted as
    # passed over for a newer one
    frames = []
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"no frame for 1 s \(read_timeout_s\): the stream "
                                          "stalled"):
        while True:
            if (f := src.read(0.5)) is not None:
                frames.append(f)
                t0 = time.monotonic()
    assert 0.8 <= time.monotonic() - t0 < 3.0  # the old code had no timeout: ~30 s (FFmpeg)
    assert frames and {f.image.shape for f in frames} == {(48, 64, 3)}
    assert len(frames) + sum(f.skipped for f in frames) == 10
    assert frames[-1].ref == "frame-10"
    src.close()


@pytest.mark.parametrize(("took_s", "read_timeout_s", "stall"), [
    (2.01, 2.0, True),   # OpenCV's grab() True after its timeout fired (a held-back frame)
    (2.04, 2.0, True),
    (2.0, 2.0, True),    # the timeout itself (grab() False)
    (1.97, 2.0, True),   # within the 2 % margin (the setting in whole ms)
    (1.95, 2.0, False),  # a frame that came late, within the timeout
    (0.1, 2.0, False),   # a frame as usual
    (0.0, 2.0, False),
    (4.99, 5.0, True),
    (4.5, 5.0, False),   # a grab failed before the timeout (the old factor 0.9: a stall)
    (30.0, 5.0, True),   # a grab that overran its timeout (a hung host)
])
def test_a_grab_that_took_the_read_timeout_is_a_stall_whatever_it_returned(
        took_s, read_timeout_s, stall):
    assert stalled(took_s, read_timeout_s) is stall


@pytest.mark.parametrize("scheme", ["http", "rtsp"])
def test_a_dead_stream_times_out_within_the_open_timeout(silent_server, scheme):
    url = f"{scheme}://user:secret@127.0.0.1:{silent_server}/cam"
    t0 = time.monotonic()
    with pytest.raises(SourceError) as err:
        CaptureSource(SourceConfig(kind="capture", path=url, open_timeout_s=1.5))
    took = time.monotonic() - t0
    assert 1.2 <= took < 4.0, took
    assert "no stream within 1.5 s (open_timeout_s)" in str(err.value)
    assert "secret" not in str(err.value) and "***@127.0.0.1" in str(err.value)


def test_a_refused_stream_fails_at_once_saying_so():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="cannot open .*refused"):
        CaptureSource(SourceConfig(kind="capture", path=f"rtsp://127.0.0.1:{port}/x"))
    assert time.monotonic() - t0 < 3.0


class _Rtsp(socketserver.StreamRequestHandler):
    """Just enough RTSP for FFmpeg to get to SETUP; the Transport header it asks for there is
    recorded (RTP/AVP/TCP = interleaved over the RTSP connection, RTP/AVP = UDP)."""

    SDP = (b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=cam\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
           b"m=video 0 RTP/AVP 26\r\na=control:track1\r\n")

    def handle(self):
        while True:
            lines = []
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                lines.append(line.decode(errors="replace").strip())
            if not lines:
                return
            method = lines[0].split()[0]
            headers = dict(x.split(":", 1) for x in lines[1:] if ":" in x)
            cseq = headers.get("CSeq", "0").strip()
            if method == "SETUP":
                self.server.transports.append(headers.get("Transport", "").strip())
                self.wfile.write(f"RTSP/1.0 461 Unsupported Transport\r\nCSeq: {cseq}\r\n\r\n"
                                 .encode())
                return
            body = self.SDP if method == "DESCRIBE" else b""
            extra = ("Content-Type: application/sdp\r\nContent-Base: "
                     f"rtsp://127.0.0.1:{self.server.server_address[1]}/cam/\r\n"
                     if body else "Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN\r\n")
            self.wfile.write(f"RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n{extra}Content-Length: "
                             f"{len(body)}\r\n\r\n".encode() + body)


@pytest.mark.parametrize(("transport", "asked"), [("tcp", "RTP/AVP/TCP"), ("udp", "RTP/AVP/UDP")])
def test_the_rtsp_transport_setting_reaches_ffmpeg(transport, asked):
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Rtsp)
    srv.daemon_threads = True
    srv.transports = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SourceError):  # the camera refuses every transport
            CaptureSource(SourceConfig(kind="capture", transport=transport, open_timeout_s=3,
                                       path=f"rtsp://127.0.0.1:{srv.server_address[1]}/cam"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.transports and srv.transports[0].startswith(asked), srv.transports
    assert "OPENCV_FFMPEG_CAPTURE_OPTIONS" not in os.environ  # put back as it was


def test_ffmpeg_and_opencv_noise_stays_off_the_terminal(tmp_path, silent_server):
    """A daemon's capture of dead streams prints nothing of FFmpeg's or OpenCV's own; the
    daemon's own SourceError says what happened. (A child process: FFmpeg reads its log level
    once per process.)"""
    code = f"""
import logging, sys
logging.basicConfig(level=logging.INFO)
from runtime.config.source import SourceConfig
from runtime.frames.capture_source import CaptureSource, stalled
from runtime.frames.frame import SourceError
for url in ("rtsp://127.0.0.1:1/x", "http://127.0.0.1:{silent_server}/x"):
    try:
        CaptureSource(SourceConfig(kind="capture", path=url, open_timeout_s=1))
    except SourceError as e:
        print("edgerun:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=child_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("edgerun: ") == 2, out.stdout
    text = out.stdout + out.stderr
    for noise in ("[tcp @", "[http @", "WARN", "OPENCV:FFMPEG", "Connection refused"):
        assert noise not in text, text
