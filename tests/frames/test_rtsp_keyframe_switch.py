"""The live RTSP reader's key-frames-only mode (runtime/frames/av_source.py) where its modes
meet the field: the rate cap moved by the control loop while it runs, on a real camera
(tests/support/rtsp_camera.py) that sends what many do, pictures cut into several slices and
no access-unit delimiters. Each served picture is checked by the frame number drawn in it."""

from __future__ import annotations

import math

import pytest
from support.rtsp_camera import RtspCamera, skip_reason
from test_rtsp_camera import _Pipe

from runtime.config.source import SourceConfig
from runtime.frames.av_source import pyav_available

pytestmark = [
    pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "ok"),
    pytest.mark.skipif(not pyav_available(), reason="PyAV is not installed (the streams extra)"),
]


@pytest.mark.timeout(300)
def test_leaving_key_frames_only_serves_whole_pictures_from_a_camera_without_auds(tmp_path):
    """Cap 1 fps (key frames only), then none (every frame from the next key frame), twice.
    Without AUDs a several-slice key picture ends where the next picture's first slice begins;
    that slice was dropped as key frames only wanted, so every frame after the switch, to the
    next key frame, was decoded against a missing reference: pictures carrying a wrong or
    unreadable number (seen: 277 then 276, then two unreadable), none counted as damage."""
    with RtspCamera(tmp_path, width=320, height=180, slices=4, key_int=25, aud=False) as cam:
        p = _Pipe(tmp_path / "p", SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                                decoder="pyav"))
        runs = []
        try:
            p.until(lambda: len(p.results) >= 3, 60, "the first results")
            for _ in range(2):
                p.pipeline.rate_cap_hz = 1.0
                p.until(lambda: p.pipeline.source.keyframes_only, 60, "key frames only")
                n0 = len(p.started)
                p.pipeline.rate_cap_hz = math.inf
                p.until(lambda: not p.pipeline.source.keyframes_only, 60, "every frame again")
                p.until(lambda n0=n0: len(p.started) >= n0 + 40, 60, "40 frames after it")
                runs.append([n for n, *_ in p.started[n0:]])
            stats = p.pipeline.stats()["sources"]["main"]
        finally:
            p.pipeline.stop()
    for numbers in runs:
        print(f"served from the cap's rise: {numbers[:12]} ... ({len(numbers)} frames)")
        assert None not in numbers, numbers  # every picture whole: its number readable
        assert numbers == sorted(set(numbers)), numbers  # and each newer than the one before
    assert stats.get("stream_damaged", 0) == 0, stats
