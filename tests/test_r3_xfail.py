"""Review R3: findings in files other helpers own right now (runtime/prepare.py,
runtime/detection.py: H27). Each test fails on the current code (strict xfail) and
describes the fix; remove the mark once fixed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.xfail(strict=True, reason="H27 (runtime/prepare.py detector_truth): a YOLO label "
                   "whose class index is past the --labels list is taken silently; it should "
                   "be a ModelError naming the file and line (class 7, 3 labels: a mismatched "
                   "classes.txt), as a negative class already is")
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
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "x3.txt: line 1" in r.stderr


class _Flaky:
    """A source whose first open raises what no source is meant to raise (a bug, an OS or
    library error not wrapped in SourceError), then works: a synthetic conveyor."""

    def __init__(self, tmp_path):
        self.tmp_path, self.calls = tmp_path, 0

    def __call__(self):
        from runtime.sources import SourceConfig, open_source

        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("an unforeseen error in a source's open")
        return open_source(SourceConfig(rate_hz=50, size=32), self.tmp_path / "state")


@pytest.mark.xfail(strict=True, reason="H25 (runtime/pipeline.py _capture): only SourceError "
                   "is caught around lane.open() and lane.source.read(); anything else ends "
                   "the capture thread, and the daemon runs on (health, watchdog fed by the "
                   "idle infer loop) inspecting nothing, with no event. Seen here with a "
                   "corrupt folder state DB (sqlite3.DatabaseError), a removed folder "
                   "(FileNotFoundError) and source.size = 0 (cv2.error), each now fixed at its "
                   "source in runtime/sources.py. Fix: `except Exception` after `except "
                   "SourceError` in both places, treated as a source failure (log with the "
                   "traceback once, source_failed event, close, back off, re-open)")
def test_an_unexpected_error_in_a_source_is_a_source_failure_not_a_dead_thread(tmp_path):
    import time

    from modelgen import tiny_cnn

    from runtime.backends import discover
    from runtime.config import BackendsConfig, OnnxRuntimeConfig
    from runtime.manifest import load_model, model_files
    from runtime.pipeline import Active, Pipeline

    m = load_model(tiny_cnn(tmp_path / "tiny.onnx", hw=(32, 32)))
    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,),
                          onnxruntime=OnnxRuntimeConfig(spinning=(False,),
                                                        include_default=False))
    (backend,) = discover(bcfg)
    v = backend.variants(model_files(m)[0], bcfg, (1,))[0]
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
