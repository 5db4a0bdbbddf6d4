"""Review R3: one hostile trigger message (or source path) costs that message or a source
error, never the capture thread."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest

from models.synthetic import samples
from runtime.config.source import SourceConfig
from runtime.frames.frame import BadFrame
from runtime.frames.images import BadImage
from runtime.frames.sources import open_source
from runtime.frames.trigger_source import decode_payload
from runtime.wire.broker import Mosquitto


@pytest.mark.parametrize("payload", [b"x" * 300, ("/" + "a" * 300 + "/b.png").encode(),
                                     b"a\x00b" * 100])
def test_a_payload_naming_no_possible_file_is_refused_as_a_bad_frame(payload):
    """A text payload is tried as a path first: 256+ bytes without a '/' (a name the
    filesystem refuses) raised OSError ENAMETOOLONG out of Path.is_file()."""
    with pytest.raises(BadImage) as e:
        decode_payload(payload, 40_000_000)
    assert e.value.kind == "undecodable"


def test_a_long_text_trigger_is_refused_and_the_next_image_still_arrives(tmp_path):
    broker = Mosquitto(tmp_path).start()
    try:
        cfg = SourceConfig(kind="trigger", topic="plc/line1/trigger")
        src = open_source(cfg, tmp_path, broker.device("f", "t", read=(cfg.topic,)), "t")
        # its SUBACK, not a fixed sleep: a trigger published before the subscription is
        # lost (not retained), and a loaded host can take longer than any sleep to subscribe
        assert src._conn.subscribed.wait(30), "the trigger source never subscribed"
        img = next(samples(seed=1, count=1)).image
        _, png = cv2.imencode(".png", img)
        camera = broker.client("camera", write=(cfg.topic,))
        pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        pub.username_pw_set(camera.username, Path(camera.password_file).read_text().strip())
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        for payload in (b"x" * 300, png.tobytes()):
            pub.publish(cfg.topic, payload, qos=1).wait_for_publish(5)
        got, refused = None, []
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            try:
                got = src.read(0.2)
            except BadFrame as e:  # was: OSError [Errno 36] File name too long
                refused.append(e.kind)
        assert refused == ["undecodable"]
        assert got is not None and np.array_equal(got.image, img)
        pub.loop_stop()
        src.close()
    finally:
        broker.stop()


def test_a_capture_path_the_filesystem_refuses_is_a_source_error(tmp_path):
    """`[source] path` of 256+ characters (a long RTSP URL with a token in it, say) raised
    OSError ENAMETOOLONG from the open, which ended the capture thread."""
    from runtime.frames.capture_source import CaptureSource
    from runtime.frames.frame import SourceError

    # a URL whose host does not resolve says so (sources.md); either way one SourceError
    for path, said in (("x" * 5000, "cannot open"),
                       ("rtsp://cam/" + "a" * 5000, "cannot open|does not resolve")):
        with pytest.raises(SourceError, match=said):
            CaptureSource(SourceConfig(kind="capture", path=path, open_timeout_s=2))


def test_a_folder_path_the_filesystem_refuses_is_a_source_error(tmp_path):
    from runtime.frames.folder_source import FolderSource
    from runtime.frames.frame import SourceError

    with pytest.raises(SourceError, match="File name too long"):
        FolderSource(SourceConfig(kind="folder", path="x" * 5000), tmp_path / "state")


def test_a_file_name_cannot_forge_a_log_line(caplog):
    """A refused file named "x\\nCRITICAL edgerun.daemon: ..." printed a second log line of
    the attacker's choosing (journald files each line as its own record)."""
    from runtime.frames.badframes import BadFrames

    bad = BadFrames(lambda e: None)
    with caplog.at_level("WARNING", logger="edgerun.pipeline"):
        bad.record("undecodable", "x\nCRITICAL edgerun.daemon: all fine\r.png", "junk")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\r" not in line
    assert "x\\x0aCRITICAL edgerun.daemon: all fine\\x0d.png" in line


def test_a_trigger_flood_is_held_within_a_bound_not_all_in_memory(tmp_path, monkeypatch):
    """Every trigger message was put on an unbounded queue (acked at receipt, so the broker
    sends as fast as the publisher): a camera or PLC identity publishing faster than the
    device inspects (or a stuck pipeline) grew the daemon's memory until it was killed,
    losing every queued trigger with it. Past MAX_QUEUED messages (or MAX_QUEUED_BYTES)
    a new one is dropped and counted, and said in the log; the queued ones still arrive."""
    from runtime.frames.trigger_source import TriggerSource

    monkeypatch.setattr(TriggerSource, "MAX_QUEUED", 50)
    broker = Mosquitto(tmp_path).start()
    try:
        cfg = SourceConfig(kind="trigger", topic="plc/line1/trigger")
        src = open_source(cfg, tmp_path, broker.device("f", "t", read=(cfg.topic,)), "t")
        # its SUBACK, not a fixed sleep: a trigger published before the subscription is
        # lost (not retained), and a loaded host can take longer than any sleep to subscribe
        assert src._conn.subscribed.wait(30), "the trigger source never subscribed"
        _, png = cv2.imencode(".png", next(samples(seed=2, count=1)).image)
        camera = broker.client("camera", write=(cfg.topic,))
        pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        pub.username_pw_set(camera.username, Path(camera.password_file).read_text().strip())
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        for _ in range(200):  # nobody reads meanwhile: a pipeline that stopped taking frames
            pub.publish(cfg.topic, png.tobytes(), qos=1)
        deadline = time.monotonic() + 20
        while src.received < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert src.received == 200
        assert src.dropped == 150  # what arrived past the bound
        frames = 0
        while src.read(0.5) is not None:
            frames += 1
        assert frames == 50
        pub.loop_stop()
        src.close()
    finally:
        broker.stop()
