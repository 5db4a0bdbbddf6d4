"""Is a model seeing anything (runtime/engine/sanity.py): the judgement, table-tested, and the
daemon's `model_blind` event on a real `serve` of a deliberately mis-normalised detector."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from support.daemon_harness import Serve, events, last_health, results, write_config
from support.modelgen import blob_frame
from support.ultralytics_export import ultralytics_detector
from support.waiting import wait

from runtime.engine.sanity import FirstFrames, judge

RNG = np.random.default_rng(0)
VARIED = RNG.standard_normal((20, 5))


@pytest.mark.parametrize("outputs, kw, blind, kind", [
    (np.zeros((0, 5)), {}, False, "too-few"),
    (np.where(np.arange(100).reshape(20, 5) == 7, np.nan, VARIED), {}, True, "non-finite"),
    (np.full((20, 5), np.inf), {}, True, "non-finite"),
    (np.tile(VARIED[:1], (20, 1)), {}, True, "constant"),
    (np.tile(VARIED[:1], (20, 1)) + 1e-9, {"top1": [0] * 20}, True, "constant"),
    (VARIED, {"boxes": [0] * 20}, True, "no-boxes"),
    (VARIED, {"boxes": [1] + [0] * 19}, True, "no-boxes"),  # 1 in 20 < 1 in 10
    (VARIED, {"boxes": [1, 0] * 10}, False, "ok"),
    (VARIED[:4], {"boxes": [1, 0, 0, 0]}, False, "too-few"),  # a box, on too few to judge
    (VARIED[:4], {"boxes": [0] * 4}, True, "no-boxes"),  # no box at all is blind on any count
    (VARIED, {"top1": [3] * 20}, True, "one-class"),
    (VARIED, {"top1": [3] * 19 + [1]}, True, "one-class"),  # 95 %
    (VARIED, {"top1": [3] * 18 + [1, 2]}, False, "ok"),  # 90 %
    (VARIED[:5], {"top1": [3] * 5}, False, "too-few"),
    (VARIED[:, :1], {"top1": [0] * 20}, False, "ok"),  # one output: no class to share
    (VARIED, {}, False, "ok"),
])
def test_judge(outputs, kw, blind, kind):
    v = judge(outputs, **kw)
    assert (v.blind, v.kind) == (blind, kind), v.seen


def test_first_frames_judges_once_after_n():
    ff = FirstFrames(detector=True, n=3)
    out = np.ones((1, 7, 16), np.float32)
    assert ff.see(out, {"boxes": []}) is None and ff.see(out * 2, {"boxes": []}) is None
    v = ff.see(out * 3, {"boxes": []})
    assert v is not None and v.blind and v.kind == "no-boxes" and "boxes in 0 of 3" in v.seen
    assert ff.see(out, {"boxes": [1]}) is None and ff.verdict == v  # judged once
    cls = FirstFrames(detector=False, n=8)
    verdicts = [cls.see(np.eye(4, dtype=np.float32)[i % 4][None], {}) for i in range(8)]
    assert verdicts[-1] is not None and not verdicts[-1].blind


def _folder(root, n: int = 60):
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(n):
        cells = [(int(rng.integers(0, 4)), int(rng.integers(0, 4)), int(rng.integers(0, 3)))]
        cv2.imwrite(str(root / f"{i:03d}.png"), blob_frame((64, 64), cells))
    return root


@pytest.mark.parametrize("normalised", ["imagenet", "metadata"])
def test_serve_raises_model_blind_for_a_mis_normalised_detector(tmp_path, normalised):
    model = ultralytics_detector(tmp_path / "y.onnx")
    extra = f'[model]\npath = "{model}"\n'
    if normalised == "imagenet":  # the wrong preprocessing, given on purpose
        pre = tmp_path / "pre.json"
        pre.write_text(json.dumps({"mean": [0.485, 0.456, 0.406],
                                   "std": [0.229, 0.224, 0.225]}))
        extra += f'preprocess = "{pre}"\n'
    cfg = write_config(tmp_path, tmp_path / "cache", extra=extra,
                       source=f'kind = "folder"\npath = "{_folder(tmp_path / "in")}"\n'
                              'watch = true')
    d = Serve(tmp_path, cfg)

    def blind_in_health():
        h = last_health(d.outbox) or {}
        return next((m.get("blind") for m in h.get("models", [])), None)

    try:
        wait(lambda: len(results(d.outbox)) >= 55, 90, "55 results", d)
        if normalised == "imagenet":
            wait(lambda: blind_in_health() is not None, 30, "health saying blind", d)
        blind = events(d.outbox, "model_blind")
        said = blind_in_health()
    finally:
        assert d.stop() == 0
    boxes = sum(len(r.get("boxes", [])) for r in results(d.outbox))
    if normalised == "imagenet":
        assert boxes == 0
        (ev,) = blind
        assert ev["model"] == "y" and ev["kind"] == "no-boxes" and ev["frames"] == 50
        assert "boxes in 0 of 50" in ev["seen"] and ev["preprocess"].startswith("file")
        assert said.startswith("no-boxes: boxes in 0 of 50")
    else:
        assert boxes >= 50 and blind == [] and said is None


def test_fleet_alerts_on_a_blind_model():
    from runtime.coordinator.fleet import DeviceView, FleetConfig, alerts

    h = {"models": [{"model": "y", "blind": "no-boxes: boxes in 0 of 50 inputs"}]}
    view = DeviceView("d1", status="online", health=h)
    got = dict(alerts(view, FleetConfig(), None))
    assert "boxes in 0 of 50" in got["model_blind"] and "model y" in got["model_blind"]
    assert "model_blind" not in dict(alerts(DeviceView("d1", status="online", health={
        "models": [{"model": "y", "blind": None}]}), FleetConfig(), None))


def _nan_classifier(path):
    """[N,3,32,32] -> 5 scores, every one NaN (the square root of a negative)."""
    from onnx import TensorProto, helper, numpy_helper, save

    w = numpy_helper.from_array(np.ones((5, 3), np.float32), "w")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["s"], transB=1),
             helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("Neg", ["a"], ["n"]),
             helper.make_node("Sqrt", ["n"], ["y"])]
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def test_prepare_never_writes_a_nan_model_even_without_the_reference_check(tmp_path):
    """An outside run (2026-12-07) prepared a model whose outputs are NaN with
    `--no-reference-check`: its agreement with itself read 1.0000, and the bundle was signed
    and deployed (the device caught it only at profiling)."""
    from runtime.engine.manifest import Preprocess
    from runtime.engine.prepare import PrepareOptions, StepError, prepare

    out = tmp_path / "out"
    with pytest.raises(StepError, match="NaN or Inf"):
        prepare(_nan_classifier(tmp_path / "nan.onnx"), None, None, out,
                PrepareOptions(name="nan", preprocess=Preprocess(), check_reference=False))
    assert not (out / "manifest.json").exists()
