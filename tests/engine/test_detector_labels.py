"""Review R3's findings in the detector labels and the capture thread: a YOLO class index
past the labels list is refused naming file and line; an unexpected error in a source is a
failure of that source (retried), not the silent end of its capture thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
from support.under_test import child_env

ROOT = Path(__file__).parents[2]


def test_prepare_refuses_a_yolo_class_past_the_labels(tmp_path):
    val = tmp_path / "val"
    (val / "images").mkdir(parents=True)
    (val / "labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        cv2.imwrite(str(val / "images" / f"x{i}.png"), rng.integers(0, 256, (96, 96, 3),
                                                                     np.uint8))
        (val / "labels" / f"x{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (val / "labels" / "x3.txt").write_text("7 0.5 0.5 0.1 0.1\n")
    (tmp_path / "classes.txt").write_text("scratch\ndent\nstain\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare",
                        str(ROOT / "models" / "defects" / "fp32.onnx"), "--val", str(val),
                        "--labels", str(tmp_path / "classes.txt"), "--out",
                        str(tmp_path / "out"), "--task", "detect", "--format", "yolov8"],
                       capture_output=True, text=True, timeout=300,
                       env=child_env())
    assert r.returncode == 2, r.stderr[-2000:]
    assert "x3.txt: line 1" in r.stderr


class _Flaky:
    """A source whose first open raises what no source is meant to raise (a bug, an OS or
    library error not wrapped in SourceError), then works: a synthetic conveyor."""

    def __init__(self, tmp_path):
        self.tmp_path, self.calls = tmp_path, 0

    def __call__(self):
        from runtime.config.source import SourceConfig
        from runtime.frames.sources import open_source

        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("an unforeseen error in a source's open")
        return open_source(SourceConfig(rate_hz=50, size=32), self.tmp_path / "state")


def test_an_unexpected_error_in_a_source_is_a_source_failure_not_a_dead_thread(tmp_path):
    import time

    from support.tiny_ort import tiny_variant

    from runtime.frames.pipeline import Active, Pipeline

    m, backend, v = tiny_variant(tmp_path)
    out: list[dict] = []
    evs: list[dict] = []
    p = Pipeline(_Flaky(tmp_path), m, lambda rs: out.extend(rs) or list(range(len(rs))),
                 evs.append)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        deadline = time.monotonic() + 10
        while len(out) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.stop()
    assert any(e["type"] == "source_failed" for e in evs), evs
    assert len(out) >= 5  # re-opened after the backoff, and inspecting
