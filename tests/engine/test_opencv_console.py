"""OpenCV's own console lines while the daemon profiles OpenCV DNN variants. Found in a field
run (2026-12-07): `edgerun serve` on an RTSP camera wrote 12 lines like `[ERROR:3@44.899]
global onnx_importer2.cpp:1043 parseNode DNN/ONNX: unknown input 'graph_input_cast_0'` to
the journal in one profiling round, naming no model, beside the daemon's own WARNING that
says the same with the variants' names. runtime/engine/backends/opencv.py sets OpenCV's log
level to SILENT for that reason; the capture source's quiet_ffmpeg()
(runtime/frames/capture_source.py) then sets it to ERROR for the whole process, raising it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.under_test import child_env

from models import bundled

FP16 = bundled() / "fp16.onnx"  # OpenCV's DNN refuses its Cast input

CODE = f"""
import cv2
import runtime.engine.backends.opencv  # the daemon profiles OpenCV variants
from runtime.frames.capture_source import quiet_ffmpeg
quiet_ffmpeg(False)  # then a camera is opened
try:
    cv2.dnn.readNetFromONNX({str(FP16)!r})
except cv2.error:
    pass  # the backend reports it (BackendError), with the model's name
"""


@pytest.mark.skipif(not FP16.exists(), reason="bundled model not built")
def test_a_camera_opened_keeps_opencvs_dnn_errors_off_the_journal():
    env = child_env()
    env.pop("OPENCV_LOG_LEVEL", None)  # the operator's own level is kept (as it should be)
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[ERROR" not in out.stderr, out.stderr[-2000:]
