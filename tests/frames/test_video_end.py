"""Video files end cleanly (or loop when configured); a stream that opens and then fails backs
off 0.5 s doubling (jittered) to its cap (docs/daemon.md). Real videos written by
cv2.VideoWriter, a real HTTP server for the stream, the real ONNX Runtime session in the
pipeline."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.daemon_harness import Serve, events, last_health, results, write_config
from support.tiny_ort import tiny_variant
from support.waiting import wait

from runtime.config.source import SourceConfig
from runtime.frames.capture import Capture
from runtime.frames.capture_source import CaptureSource
from runtime.frames.frame import SourceEnded
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.sources import open_source


def _video(path: Path, frames: int = 30, size: int = 64) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (size, size))
    for i in range(frames):
        w.write(np.full((size, size, 3), (i * 8) % 256, np.uint8))
    w.release()
    return path


class _Pipe:
    """A real Pipeline on a tiny ONNX model with ONNX Runtime, results and events in lists."""

    def __init__(self, tmp_path: Path, cfg: SourceConfig):
        m, backend, v = tiny_variant(tmp_path)
        self.results: list[dict] = []
        self.events: list[dict] = []
        self.pipeline = Pipeline(lambda: open_source(cfg, tmp_path / "state"), m,
                                 self._sink, self.events.append)
        self.pipeline.start(Active(0, v.id, backend.load(v), v.model.input_shape))

    def _sink(self, rs: list[dict]) -> list[int]:
        self.results.extend(rs)
        return list(range(len(rs)))

    def of(self, type_: str) -> list[dict]:
        return [e for e in list(self.events) if e["type"] == type_]

    def until(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.events}"
            time.sleep(0.02)


def test_capture_source_ends_after_the_last_frame_or_loops(tmp_path):
    path = _video(tmp_path / "line.avi", frames=5)
    src = CaptureSource(SourceConfig(kind="capture", path=str(path)))
    assert [src.read(0.5).ref for _ in range(5)] == [f"frame-{i}" for i in range(1, 6)]
    with pytest.raises(SourceEnded, match="end of the video file after 5 frames"):
        src.read(0.5)
    src.close()
    looped = CaptureSource(SourceConfig(kind="capture", path=str(path), loop=True))
    frames = [looped.read(0.5) for _ in range(12)]  # 5 + 5 + 2, no error between passes
    assert [f.ref for f in frames][-1] == "frame-12"
    means = [int(f.image.mean()) for f in frames]
    assert means[:5] == means[5:10] and means[10:] == means[:2]  # really from the start again
    looped.close()


def test_a_video_file_is_inspected_once_and_the_end_is_reported_once(tmp_path):
    p = _Pipe(tmp_path, SourceConfig(kind="capture", path=str(_video(tmp_path / "v.avi"))))
    try:
        p.until(lambda: p.of("source_ended"), 20, "the end of the video")
        # the end is read before the last frames are inspected: wait for those, then longer
        # than the old capture loop's re-open period (0.5 s) for any extra
        p.until(lambda: len(p.results) >= 30, 30, "the last frames' results")
        time.sleep(1.5)
        assert len(p.results) == 30
        assert [r["ref"] for r in p.results] == [f"frame-{i}" for i in range(1, 31)]
        (ended,) = p.of("source_ended")
        assert ended["severity"] == "info" and "after 30 frames" in ended["reason"]
        assert p.of("source_failed") == []
        stats = p.pipeline.stats()
        assert stats["source_ended"] == 1 and stats.get("source_errors", 0) == 0
    finally:
        p.pipeline.stop()


def test_a_looped_video_file_plays_again_without_errors(tmp_path):
    cfg = SourceConfig(kind="capture", path=str(_video(tmp_path / "v.avi", frames=10)),
                       loop=True)
    p = _Pipe(tmp_path, cfg)
    try:
        p.until(lambda: len(p.results) >= 35, 20, "35 results from a 10-frame file")
        assert p.of("source_failed") == [] and p.of("source_ended") == []
    finally:
        p.pipeline.stop()


@pytest.fixture
def http_video(tmp_path):
    """The 30-frame video served over HTTP: OpenCV opens the URL as a stream (live), reads its
    frames, then fails; every re-open succeeds at once."""
    _video(tmp_path / "cam.avi")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/cam.avi"
    srv.shutdown()
    srv.server_close()


def test_a_stream_that_opens_then_fails_backs_off_doubling(tmp_path, http_video):
    p = _Pipe(tmp_path, SourceConfig(kind="capture", path=http_video))
    try:
        assert p.pipeline.source is None or p.pipeline.source.live
        p.until(lambda: len(p.of("source_failed")) >= 4, 20, "four stream failures")
        # The old loop reset the delay on every successful open: 0.5, 0.5, 0.5, ...
        # doubling from 0.5 s, each jittered down to as little as half (runtime/wire/mqtt.py)
        retries = [e["retry_s"] for e in p.of("source_failed")[:4]]
        assert all(c / 2 - 0.05 <= r <= c + 0.05
                   for r, c in zip(retries, [0.5, 1, 2, 4], strict=True)), \
            retries
        # each connection delivered its frames (a live source may drop stale ones)
        lane = p.pipeline.stats()["sources"]["main"]  # served, or passed over for newer
        assert lane["frames"] + lane.get("skipped_latest", 0) >= 4 * 30 and p.results
        assert p.of("source_ended") == []  # a stream is never "ended": it is retried
    finally:
        p.pipeline.stop()


def test_a_stream_that_ran_long_enough_starts_its_backoff_afresh(tmp_path, http_video,
                                                                 monkeypatch):
    monkeypatch.setattr(Capture, "STABLE_S", 0.0)  # every connection counts as stable
    p = _Pipe(tmp_path, SourceConfig(kind="capture", path=http_video))
    try:
        p.until(lambda: len(p.of("source_failed")) >= 3, 20, "three stream failures")
        assert all(0.2 <= e["retry_s"] <= 0.5 for e in p.of("source_failed")[:3])
    finally:
        p.pipeline.stop()


def test_serve_on_a_video_file_stops_inspecting_at_its_end_and_keeps_running(tmp_path):
    video = _video(tmp_path / "line.avi", size=96)
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source=f'kind = "capture"\npath = "{video}"')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: events(d.outbox, "source_ended"), 120, "the source_ended event", d)
        t_end = time.time()
        wait(lambda: (last_health(d.outbox) or {}).get("t", 0) > t_end + 1, 30,
             "health after the end", d)  # the daemon still runs and reports
        assert d.proc.poll() is None
        assert len(results(d.outbox)) == 30
        assert len(events(d.outbox, "source_ended")) == 1
        assert events(d.outbox, "source_failed") == []
        assert last_health(d.outbox)["pipeline"]["source_ended"] == 1
    finally:
        assert d.stop() == 0
    assert d.text().count("source ended:") == 1
