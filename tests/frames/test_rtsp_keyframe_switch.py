"""The live RTSP reader's key-frames-only mode (runtime/frames/av_source.py) where its modes
meet the field: the rate cap moved by the control loop while it runs, on a real camera
(tests/support/rtsp_camera.py) that sends what many do, pictures cut into several slices and
no access-unit delimiters. Each served picture is checked by the frame number drawn in it."""

from __future__ import annotations

import itertools
import logging
import math
import time

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


@pytest.mark.timeout(300)
def test_key_frames_only_serve_the_capped_rate_on_average(tmp_path):
    """A key frame every 10 frames (2.5 a second) read at a 1 fps cap: key frames alone are
    decoded, and served 25 frames apart on average (alternately 20 and 30: a key frame comes
    0.4 s apart), by the camera's own clock (the frame numbers), not the host's. Counted from
    each frame's serving, a due time half a key interval short of 1 s fell just after the key
    frame 0.8 s on: every third key frame served, 30 frames apart, 0.83 fps."""
    with RtspCamera(tmp_path, width=320, height=180, key_int=10) as cam:
        p = _Pipe(tmp_path / "p", SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                                decoder="pyav"))
        try:
            p.pipeline.rate_cap_hz = 1.0
            p.until(lambda: len(p.results) >= 3, 60, "the first results")
            p.until(lambda: p.pipeline.source.keyframes_only, 60, "key frames only")
            p.until(lambda: len(p.started) >= 3, 60, "a result in key frames only")
            n0 = len(p.started)
            p.until(lambda: len(p.started) >= n0 + 16, 90, "16 frames at the cap")
            keys_only = p.pipeline.source.keyframes_only
        finally:
            p.pipeline.stop()
    numbers = [n for n, *_ in p.started[n0:]]
    assert keys_only and None not in numbers, numbers
    gaps = [b - a for a, b in itertools.pairwise(numbers)]
    mean = sum(gaps) / len(gaps)
    print(f"1 fps cap, 2.5 key frames/s: served {len(numbers)} frames, gaps {gaps} (frames), "
          f"mean {mean:.1f} (25 at the cap)")
    assert all(g % 10 == 0 for g in gaps), gaps  # key frames only
    assert 22.5 <= mean <= 27.5, gaps


@pytest.mark.timeout(300)
@pytest.mark.parametrize("aggregate", ["zero-latency", "max-stap"])
def test_nals_bundled_into_one_packet_are_decoded_each_in_its_picture(tmp_path, aggregate):
    """A camera (or a relay in front of it) bundling small NALs into one RTP packet (STAP-A:
    GStreamer's rtph264pay aggregate-mode; AUD, SPS, PPS and a small slice together). FFmpeg's
    depacketizer hands such a packet over as one, a start code ahead of each NAL; read as one
    NAL, its slice was hidden behind the AUD/SPS it came with and decoded with the next
    picture: 44-63 of ~200 frames unreadable here, others out of order, no damage counted.
    Every frame served, at no cap and at 1 fps, must carry a readable number, each newer."""
    with RtspCamera(tmp_path, width=320, height=180, key_int=25, aggregate=aggregate) as cam:
        p = _Pipe(tmp_path / "p", SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                                decoder="pyav"))
        try:
            p.until(lambda: len(p.started) >= 50, 60, "50 frames at no cap")
            p.pipeline.rate_cap_hz = 1.0
            p.until(lambda: p.pipeline.source.keyframes_only, 60, "key frames only")
            n0 = len(p.started)
            p.until(lambda: len(p.started) >= n0 + 3, 60, "3 key frames")
            stats = p.pipeline.stats()["sources"]["main"]
        finally:
            p.pipeline.stop()
    numbers = [n for n, *_ in p.started]
    print(f"{aggregate}: {len(numbers)} frames, {numbers.count(None)} unreadable")
    assert None not in numbers, numbers
    assert numbers == sorted(set(numbers)), numbers
    assert stats.get("stream_damaged", 0) == 0, stats


@pytest.mark.timeout(120)
def test_the_key_frame_rate_is_the_cameras_from_the_first_gops_after_connecting(tmp_path,
                                                                               caplog):
    """A key frame a second, read at a 2 fps cap: every frame is to be decoded (2 is above
    the key-frame rate) from the first frame on. At a connection the camera's ~1 s backlog
    arrives at once: timed by their arrival, the first key frames read ~3 a second (2.95,
    1.79, 1.49, ... for 7 s, until they left the window), and 2 fps was served from key
    frames alone (1 a second) for the first seconds. Timed by the stream's clock (RTP
    timestamps) the rate is the camera's from the third key frame."""
    from runtime.frames.av_source import AvStreamSource

    caplog.set_level(logging.INFO, logger="edgerun.source")
    with RtspCamera(tmp_path, width=320, height=180, key_int=25) as cam:
        src = AvStreamSource(SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                          decoder="pyav"))
        rates, keys_only, served = [], [], 0
        try:
            src.rate_hint(2.0)
            end = time.monotonic() + 60
            while served < 14 and time.monotonic() < end:  # 7 s at the cap: 7 key frames
                served += src.read(1.0) is not None
                keys_only.append(src.keyframes_only)
                if hz := src.key_frame_hz():
                    rates.append(round(hz, 3))
        finally:
            src.close()
    print(f"key frames/s as measured, each served frame from the first known: {rates}")
    assert served == 14 and len(rates) >= 8, rates
    assert all(0.95 <= r <= 1.05 for r in rates), rates
    assert not any(keys_only), "switched to key frames only under a cap above their rate"
    assert "decoding key frames only" not in caplog.text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("decoder", ["pyav", "opencv"])
def test_a_raised_cap_takes_effect_at_once_not_after_the_old_caps_interval(tmp_path, decoder):
    """A 0.1 Hz cap (with PyAV: key frames only), then 5 Hz a second after a frame was
    served: the next frame is served within a read's timeout (0.5 s) and, key frames only,
    the next key frame (one a second), and 5 a second after it. The due time planned at the
    0.1 Hz cap (PyAV), the capture's wait of 1/cap after each frame (OpenCV), held the next
    frame until 10 s after the last (seen: 8.0 s after the change)."""
    with RtspCamera(tmp_path, width=320, height=180, key_int=25) as cam:
        p = _Pipe(tmp_path / "p", SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                                decoder=decoder))
        try:
            p.until(lambda: len(p.results) >= 3, 60, "the first results")
            p.pipeline.rate_cap_hz = 0.1
            if decoder == "pyav":
                p.until(lambda: p.pipeline.source.keyframes_only, 60, "key frames only")
            n0 = len(p.started)
            p.until(lambda: len(p.started) > n0, 30, "a frame at the 0.1 Hz cap")
            time.sleep(1.0)
            n1, t_change = len(p.started), time.monotonic()
            p.pipeline.rate_cap_hz = 5.0
            p.until(lambda: len(p.started) > n1, 30, "a frame at the 5 Hz cap")
            first_s = p.started[n1][1] - t_change
            p.until(lambda: len(p.started) >= n1 + 16, 30, "15 frames more")
            served = p.started[n1:]
        finally:
            p.pipeline.stop()
    rate = (len(served) - 2) / (served[-1][1] - served[1][1])
    print(f"{decoder} 0.1 -> 5 Hz: the first frame {first_s:.2f} s after the change, then "
          f"{rate:.2f} frames/s")
    assert first_s < 2.5, first_s  # 1.5 s at worst (a read's timeout, a key frame's wait)
    assert 4.5 <= rate <= 5.5, rate


@pytest.mark.timeout(120)
@pytest.mark.parametrize("decoder", ["pyav", "opencv"])
def test_under_an_every_frame_cap_only_frames_that_can_be_served_are_converted(tmp_path,
                                                                               decoder):
    """25 fps read at a 5 Hz cap: every frame is decoded (P-frames need their references),
    the first after each due time served. A frame decoded more than a frame interval before
    its due time is never served (a newer one comes before it is due), yet each was converted
    to BGR (~0.4 ms at 720p): 6 conversions per frame served (153 for 25; OpenCV's capture
    retrieved every frame, 5 per frame served, and the pipeline waited out the cap). Now the
    one served and, where the stream's phase puts one there, the frame decoded within a
    quarter interval before the due time (1 or 2 a frame served: 25 and 39 for 25 here), the
    frames passed over still counted (`skipped`) and numbered as before."""
    from runtime.frames.av_source import AvStreamSource
    from runtime.frames.capture_source import CaptureSource

    kind = AvStreamSource if decoder == "pyav" else CaptureSource
    with RtspCamera(tmp_path, width=320, height=180, key_int=25) as cam:
        src = kind(SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                decoder=decoder))
        try:
            src.rate_hint(5.0)
            end = time.monotonic() + 30
            while src.read(1.0) is None or not src.paced:  # the stream's interval known
                assert time.monotonic() < end
            frames = []
            c0 = src.converted
            while len(frames) < 25 and time.monotonic() < end:
                if (f := src.read(1.0)) is not None:
                    frames.append(f)
            conversions = src.converted - c0
        finally:
            src.close()
    span = frames[-1].t - frames[0].t
    numbers = [int(f.ref.split("-")[1]) for f in frames]
    passed = sum(f.skipped for f in frames[1:])
    print(f"5 Hz cap: {len(frames)} served in {span:.2f} s, {conversions} conversions, "
          f"{passed} frames passed over, refs {numbers[:6]} ...")
    assert 4.5 <= (len(frames) - 1) / span <= 5.5
    assert conversions <= 2 * len(frames) + 2, conversions
    # every decoded frame still counted and numbered: ~5 a served frame at 25 fps
    assert 3.5 <= (numbers[-1] - numbers[0]) / (len(frames) - 1) <= 6.5, numbers
    assert passed == numbers[-1] - numbers[0] - (len(frames) - 1), (passed, numbers)
