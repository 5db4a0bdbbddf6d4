"""Sources on their own: the MQTT trigger against Mosquitto, a capture from a video file."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest

from models.synthetic import samples
from runtime.sources import (
    BadFrame,
    CaptureSource,
    SourceConfig,
    SourceEnded,
    SourceError,
    open_source,
)
from runtime.telemetry.broker import Mosquitto


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
        time.sleep(0.5)  # subscribed
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
