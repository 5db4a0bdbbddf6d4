"""Stopping the pipeline while a capture thread is inside FFmpeg: the stop must outlast the
open (or read) it is in, bounded by the source's own timeouts. A thread left there (the join
gave up after 2 s) came back out of FFmpeg into the finalizing interpreter when `serve`
exited: SIGSEGV, exit -11, in 1 of 6 stops of `edgerun serve` whose camera URL was a black
hole (2026-12-07, the stop 7.5 s after start with open_timeout_s 10)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from support.tiny_ort import tiny_active

from runtime.config.source import SourceConfig
from runtime.frames.multisource import single
from runtime.frames.pipeline import Pipeline
from runtime.frames.sources import open_source


@pytest.mark.parametrize("decoder", ["pyav", "opencv", "rtp"])
def test_a_stop_outlasts_a_capture_threads_open_into_a_black_hole(tmp_path, decoder):
    if decoder in ("pyav", "rtp"):
        pytest.importorskip("av")
    # a black hole: a listener whose one-place backlog is full, so a connect is never
    # answered (SYNs dropped), as behind a firewall that drops them
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fill = socket.create_connection(srv.getsockname())
    cfg = SourceConfig(kind="capture", path=f"rtsp://127.0.0.1:{srv.getsockname()[1]}/x",
                       decoder=decoder, open_timeout_s=4.0, read_timeout_s=1.0)
    m, active = tiny_active(tmp_path)
    opening = threading.Event()

    def opener():
        opening.set()
        return open_source(cfg, tmp_path)

    p = Pipeline(single(cfg, opener), m, lambda rs: list(range(len(rs))), lambda e: None)
    p.start(active)
    try:
        assert opening.wait(10)
        time.sleep(0.3)
        t0 = time.monotonic()
        p.stop()
        took = time.monotonic() - t0
        left = [t.name for t in threading.enumerate() if t.name.startswith("capture")]
        assert not left, f"{left} still inside the open after a {took:.1f} s stop"
        assert took < cfg.open_timeout_s + 2
    finally:
        fill.close()
        srv.close()
