"""A stalled camera under `edgerun serve` (its RTSP server SIGSTOPped: the connection stays
open, nothing arrives). Found in a field run (2026-12-07): with `read_timeout_s = 5` the daemon
said "no frame for 5 s (read_timeout_s): the stream stalled" 10.0 s after the stall, three
times of three (10.04, 10.07 s, and 10.5 s from the events), twice the setting it names: the
frames a line loses to a stalled camera before the operator hears of it are doubled.

That was OpenCV's reader (runtime/frames/capture_source.py stalled()). PyAV's reader
(av_source.py) times its stall from the read that began it, not from a frame a timed-out read
may still return: measured alone on a paused camera, 2.01-2.07 s with read_timeout_s = 2 and
5.02 s with 5 (three each, 2026-12-07); pinned here through `serve` too."""

from __future__ import annotations

import time

import pytest
from support.daemon_harness import Serve, write_config
from support.rtsp_camera import RtspCamera, skip_reason
from support.waiting import wait

from models import bundled
from runtime.frames.av_source import pyav_available

pytestmark = [
    pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok"),
    pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                       reason="bundled model not built"),
]

READ_TIMEOUT_S = 2.0


@pytest.mark.parametrize("decoder", [
    "opencv", pytest.param("pyav", marks=pytest.mark.skipif(
        not pyav_available(), reason="PyAV is not installed (the streams extra)"))])
def test_a_stalled_camera_is_said_within_its_read_timeout(tmp_path, tmp_path_factory,
                                                          decoder):
    (tmp_path / "camera").mkdir()
    with RtspCamera(tmp_path / "camera", width=320, height=180, fps=10, key_int=10) as cam:
        cfg = write_config(
            tmp_path, tmp_path_factory.mktemp("profiles"),
            source=f'kind = "capture"\npath = "{cam.url}"\ndecoder = "{decoder}"\n'
                   f"read_timeout_s = {READ_TIMEOUT_S}")
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and "preprocessing 320x180->" in d.text(), 120,
                 "frames from the camera", d)
            time.sleep(1)  # serving
            cam.pause()
            t0 = time.monotonic()
            wait(lambda: "the stream stalled" in d.text(), 30, "the stall said", d)
            took = time.monotonic() - t0
            cam.resume()
        finally:
            d.stop()
    # the log's own poll adds ~0.05 s; a second of slack for a loaded host
    assert took <= READ_TIMEOUT_S + 1.0, f"stall said {took:.1f} s after it began"
