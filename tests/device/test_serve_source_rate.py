"""`[source] rate_hz` on a camera. Found in a field run (2026-12-07): `edgerun serve` with
`[source] kind = "capture"`, an RTSP camera at 10 fps and `rate_hz = 5` inspected 7.9-10
frames a second; `edgerun check` said the file was ok. The same camera as the one entry of
`[[sources]]` is inspected at its `rate_hz` (docs/sources.md), and the budget plans the single
source at `[source] rate_hz` too (runtime/device/source_plan.py streams()), so the ladder was
sized for a rate the pipeline never kept."""

from __future__ import annotations

import time
import urllib.request

import pytest
from support.daemon_harness import Serve, last_health, write_config
from support.rtsp_camera import RtspCamera, skip_reason
from support.waiting import wait
from support.web import gauges

from models import bundled
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


def test_a_single_camera_is_inspected_at_its_rate_hz(tmp_path, tmp_path_factory):
    port = free_port()
    (tmp_path / "camera").mkdir()
    with RtspCamera(tmp_path / "camera", width=320, height=180, fps=10, key_int=10) as cam:
        cfg = write_config(
            tmp_path, tmp_path_factory.mktemp("profiles"),
            source=f'kind = "capture"\npath = "{cam.url}"\nrate_hz = 2',
            extra=f"[local_api]\nport = {port}\n")
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and _made(port) >= 5, 120, "results from the camera", d)
            before, t0 = _made(port), time.monotonic()
            time.sleep(10)
            rate = (_made(port) - before) / (time.monotonic() - t0)
            t_end = time.time()
            wait(lambda: (last_health(d.outbox) or {}).get("t", 0) > t_end, 10,
                 "health after the measurement", d)
            main = last_health(d.outbox)["pipeline"]["sources"]["main"]
        finally:
            d.stop()
    # 2/s asked; the camera offers 10/s. 3/s leaves room for a frame early or late
    assert 1.5 <= rate <= 3.0, f"{rate:.1f} results/s with [source] rate_hz = 2"
    # the frames between the slots were read and skipped, counted as a [[sources]] entry's
    # are: by the reader pacing itself (skipped_latest) or by the lane's pacer (skipped_rate)
    skipped = main.get("skipped_latest", 0) + main.get("skipped_rate", 0)
    assert skipped >= 2 * main["frames"], main
