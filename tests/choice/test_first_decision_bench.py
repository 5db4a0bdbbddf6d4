"""bench/first_decision.py's detector (issue 13 part 5: the ~100 ms detector's ladder): the
generated model is deterministic, YOLOv8-shaped and decodes to a handful of boxes; the
noise-floor arithmetic the bench prints."""

from __future__ import annotations

import math

import onnxruntime as ort
from support.benches import load_bench

from runtime.engine import detection
from runtime.engine.manifest import Preprocess
from runtime.engine.prepare import generated_frames


def _bench():
    return load_bench("first_decision")


def test_detector_is_deterministic_yolov8_shaped_and_detects_a_few_boxes(tmp_path):
    bench = _bench()
    a = bench.detector_model(tmp_path / "a.onnx", hw=64, width=4)
    b = bench.detector_model(tmp_path / "b.onnx", hw=64, width=4)
    assert a.read_bytes() == b.read_bytes()  # cached by its arguments: must be reproducible
    sess = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"])
    n = 8 * 8 + 4 * 4 + 2 * 2  # candidates at strides 8, 16, 32
    classes = len(bench.DETECTOR_CLASSES)
    x = Preprocess().apply(generated_frames((64, 64), 1, seed=1)[0], (1, 3, 64, 64))
    out = sess.run(None, {"images": x})[0]
    assert out.shape == (1, 4 + classes, n)
    assert detection.guess_format(out.shape, classes) == "yolov8"
    assert out[0, :4].min() >= 0 and out[0, :4].max() <= 64  # boxes in input pixels
    # the score shift leaves ~0.3 % of the candidates above 0.25: some boxes, not hundreds
    passing = int((out[0, 4:] > 0.25).sum())
    assert 1 <= passing <= 0.05 * n * classes
    dets = detection.detect(out, detection.DetectSpec(), (64, 64), classes)
    assert 1 <= len(dets) <= passing


def test_noise_floor_arithmetic():
    bench = _bench()
    assert math.isclose(bench.rel_spread([1.0, 1.1, 0.9]), 0.2)
    assert math.isnan(bench.rel_spread([1.0]))
    assert bench.spread([1.0, 3.0, 2.0]) == "2.0 (1.0-3.0)"
    assert bench.spread([math.nan, 2.0]) == "2.0 (2.0-2.0)"
    assert bench.spread([math.nan]) == "n/a"


def test_detector_ladder_is_prepared_by_the_cli_once_and_then_reused(tmp_path, capsys):
    from runtime.engine.manifest import load_manifest

    bench = _bench()
    out = bench.detector_ladder(tmp_path, hw=64, width=4, images=8)
    printed = capsys.readouterr().out
    assert "$ edgerun models prepare" in printed and "prepared in" in printed
    m = load_manifest(out)
    assert [v.precision for v in m.variants] == ["fp32", "fp16", "int8", "fp32-reduced"]
    assert m.variants[-1].input_shape[-1] < 64  # the reduced form: the 4-rung ladder
    assert all(v.accuracy is not None for v in m.variants)  # mAP against fp32's detections
    doc = (out / "manifest.json").read_text()
    assert '"task": "detect"' in doc and '"format": "yolov8"' in doc
    again = bench.detector_ladder(tmp_path, hw=64, width=4, images=8)
    assert again == out and "from the cache" in capsys.readouterr().out
