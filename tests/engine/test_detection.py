"""Detectors: decode of the three output forms, class-wise NMS, mAP, the manifest's
postprocess section, a bare detector-shaped .onnx, `models prepare` with mAP rungs, and a
YOLO-style detector from prepare to results with boxes at a coordinator."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.modelgen import blob_frame, tiny_cnn, tiny_detector

from runtime.engine.detection import (
    Detections,
    DetectSpec,
    average_precision,
    decode,
    guess_format,
    mean_ap,
    nms,
    read_yolo_labels,
    to_result,
)
from runtime.engine.manifest import Preprocess, frame_result, load_manifest, load_model
from runtime.engine.onnx_model import ModelError
from runtime.engine.prepare import PrepareOptions, label_file, prepare
from runtime.wire.payloads import check

V8, V5, NMS = (DetectSpec(format=f) for f in ("yolov8", "yolov5", "nms-inside"))


def _dets(rows: list[tuple]) -> Detections:
    """(x0, y0, x1, y1, score, class) rows."""
    a = np.array(rows, np.float32).reshape(-1, 6)
    return Detections(a[:, :4], a[:, 4], a[:, 5].astype(np.int64))


# -- decode --------------------------------------------------------------------------------------

def test_decode_reads_each_form_into_normalised_xyxy():
    # two candidates on a 100x200 (h x w) input: class 1 at 0.9, class 0 at 0.1 (below 0.25)
    cand = np.array([[100, 50, 40, 20, 0.05, 0.9], [20, 20, 10, 10, 0.1, 0.02]], np.float32)
    want = np.array([[80 / 200, 40 / 100, 120 / 200, 60 / 100]], np.float32)
    v8 = decode(cand.T[None], V8, (100, 200), n_classes=2)  # [1, 4+C, N]
    assert np.allclose(v8.boxes, want) and v8.classes.tolist() == [1]
    assert np.allclose(v8.scores, [0.9])
    v8t = decode(cand[None], V8, (100, 200), n_classes=2)  # the transposed export [1, N, 4+C]
    assert np.allclose(v8t.boxes, want) and v8t.classes.tolist() == [1]
    # yolov5: score = objectness x class probability
    v5 = np.array([[100, 50, 40, 20, 0.5, 0.2, 0.9], [20, 20, 10, 10, 0.2, 1.0, 0.0]], np.float32)
    d = decode(v5[None], V5, (100, 200))
    assert np.allclose(d.boxes, want) and np.allclose(d.scores, [0.45])
    assert d.classes.tolist() == [1]
    # nms-inside: x1 y1 x2 y2 score class, in pixels
    e2e = np.array([[80, 40, 120, 60, 0.8, 2], [0, 0, 10, 10, 0.1, 0]], np.float32)
    d = decode(e2e[None], NMS, (100, 200))
    assert np.allclose(d.boxes, want) and d.classes.tolist() == [2]
    norm = DetectSpec(format="nms-inside", coords="normalised")
    assert np.allclose(decode(np.array([[[0.4, 0.4, 0.6, 0.6, 0.9, 0]]]), norm, (100, 200)).boxes,
                       [[0.4, 0.4, 0.6, 0.6]])


@pytest.mark.parametrize(("out", "spec", "classes", "error"), [
    (np.zeros((1, 16, 7)), V5, 3, "not \\[1, N, 5 \\+ classes\\]"),
    (np.zeros((1, 16, 5)), NMS, None, "not \\[1, K, 6\\]"),
    (np.zeros((1, 9, 16)), V8, 3, "no axis of 4 \\+ 3"),
    (np.zeros((1, 2, 3, 4)), V8, None, "must be \\[1, rows, cols\\]"),
])
def test_decode_refuses_an_output_not_of_the_declared_form(out, spec, classes, error):
    with pytest.raises(ValueError, match=error):
        decode(out, spec, (64, 64), classes)


def test_nms_is_class_wise_and_keeps_the_best_first():
    d = _dets([(0, 0, .5, .5, .6, 0), (0, 0, .5, .48, .9, 0),  # same object, class 0
               (0, 0, .5, .5, .7, 1),  # same place, another class: kept
               (.6, .6, .9, .9, .3, 0)])  # elsewhere: kept
    k = nms(d, 0.45)
    assert k.scores.tolist() == pytest.approx([0.9, 0.7, 0.3])
    assert k.classes.tolist() == [0, 1, 0]
    assert len(nms(d, 0.45, max_detections=2)) == 2
    assert len(nms(_dets([]), 0.5)) == 0


# -- mAP -----------------------------------------------------------------------------------------

def test_average_precision_hand_computed():
    # ranked: TP, FP, TP with 2 truths -> precision 1, 1/2, 2/3 at recall 0.5, 0.5, 1
    # all-point interpolation: 0.5 * 1 + 0.5 * 2/3
    assert average_precision(np.array([1, 0, 1]), np.array([.9, .8, .7]), 2) == pytest.approx(
        0.5 + 0.5 * 2 / 3)
    assert average_precision(np.array([1, 1]), np.array([.9, .8]), 4) == pytest.approx(0.5)
    assert average_precision(np.array([]), np.array([]), 3) == 0.0


T = (np.array([[0, 0, .5, .5], [.5, .5, 1, 1]], np.float32), np.array([0, 1]))


@pytest.mark.parametrize(("preds", "want"), [
    ([(0, 0, .5, .5, .9, 0), (.5, .5, 1, 1, .8, 1)], 1.0),  # both found
    ([(0, 0, .5, .5, .9, 0)], 0.5),  # class 1 missed: AP 1 and 0
    ([(0, 0, .5, .5, .9, 1), (.5, .5, 1, 1, .8, 0)], 0.0),  # right places, wrong classes
    ([(.02, 0, .5, .5, .9, 0), (.5, .5, 1, 1, .8, 1)], 1.0),  # IoU 0.96 >= 0.5
    ([(.3, .3, .8, .8, .9, 0), (.5, .5, 1, 1, .8, 1)], 0.5),  # class 0's box IoU < 0.5
    # a duplicate of a found box is a false positive ranked below it: AP still 1 for class 0
    ([(0, 0, .5, .5, .9, 0), (0, 0, .5, .5, .5, 0), (.5, .5, 1, 1, .8, 1)], 1.0),
    # the duplicate ranked above the real match with a worse box: FP first, AP 0.5
    ([(.3, .3, .8, .8, .95, 0), (0, 0, .5, .5, .9, 0), (.5, .5, 1, 1, .8, 1)], 0.75),
])
def test_mean_ap_table(preds, want):
    assert mean_ap([_dets(preds)], [T]) == pytest.approx(want)


def test_mean_ap_with_nothing_to_find():
    none = (np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    assert mean_ap([_dets([])], [none]) == 1.0
    assert mean_ap([_dets([(0, 0, .1, .1, .9, 0)])], [none]) == 0.0


def test_yolo_label_files(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("1 0.5 0.5 0.2 0.4\n\n0 0.1 0.1 0.2 0.2\n")
    boxes, classes = read_yolo_labels(good)
    assert classes.tolist() == [1, 0]
    assert np.allclose(boxes, [[.4, .3, .6, .7], [0, 0, .2, .2]])
    for bad in ("1 0.5 0.5 0.2\n", "x 0.5 0.5 0.2 0.2\n", "0 1.5 0.5 0.2 0.2\n",
                "-1 0.5 0.5 0.2 0.2\n"):
        good.write_text("0 0.1 0.1 0.1 0.1\n" + bad)
        with pytest.raises(ValueError, match=f"{good}: line 2"):
            read_yolo_labels(good)
    assert label_file(Path("/d/images/sub/x.png")) == Path("/d/labels/sub/x.txt")
    assert label_file(Path("/d/shots/x.jpg")) == Path("/d/shots/x.txt")


def test_result_fields_and_the_payload_schema_declares_them():
    d = _dets([(.1, .2, .3, .6, .5, 0), (.5, .5, .7, .9, .9, 1), (.0, .0, .2, .2, .4, 0)])
    r = to_result(d, ("scratch", "dent"))
    assert r["label"] == "dent" and r["score"] == 0.9
    assert r["counts"] == {"dent": 1, "scratch": 2}
    assert r["boxes"][0] == {"label": "dent", "score": 0.9, "x": 0.6, "y": 0.7, "w": 0.2,
                             "h": 0.4}
    assert [b["score"] for b in r["boxes"]] == [0.9, 0.5, 0.4]
    assert to_result(_dets([]), ("a",)) == {"label": "none", "score": 0.0, "boxes": [],
                                           "counts": {}}
    msg = {"v": 1, "stream": "s", "boot": "b", "floor": 1,
           "results": [{"seq": 1, "t": 1.0, **r}]}
    check("result", msg)  # declared: boxes and counts pass
    msg["results"][0]["boxes"][0]["w"] = 2.0  # not normalised
    with pytest.raises(ValueError, match="boxes/0/w"):
        check("result", msg)


# -- shapes: declared, guessed, refused ----------------------------------------------------------

@pytest.mark.parametrize(("shape", "classes", "want"), [
    ((1, 84, 8400), None, "yolov8"),
    ((1, 84, 8400), 80, "yolov8"),
    ((1, 8400, 84), 80, "yolov8"),  # transposed v8
    ((1, 25200, 85), None, "yolov5"),
    ((1, 25200, 85), 80, "yolov5"),
    ((1, 1024, 8), None, "yolov5"),  # the issue's shape: 3 classes
    ((1, 300, 6), None, None),  # NMS-inside or one-class v5: only a declaration says
    ((1, 300, 6), 3, "nms-inside"),
    ((1, 1000), None, None),
    ((1, 7, "N"), None, None),
])
def test_guess_format(shape, classes, want):
    assert guess_format(shape, classes) == want


def _raw_output_model(path: Path, out_shape: list[int]) -> Path:
    """A model whose output is `out_shape` (a fixed tensor plus a zero times the input)."""
    from onnx import TensorProto, helper, numpy_helper, save

    n = int(np.prod(out_shape))
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
             helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Add", ["c", "z"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0), "zero"),
             numpy_helper.from_array(rng.uniform(0, 1, n).astype(np.float32)
                                     .reshape(out_shape), "c")]
    g = helper.make_graph(nodes, "raw", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 32, 32])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, out_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    save(m, str(path))
    return path


def test_bare_detector_shaped_model_is_never_scored_as_a_classifier(tmp_path, caplog):
    issue = _raw_output_model(tmp_path / "issue.onnx", [1, 1024, 8])
    with pytest.raises(ModelError, match=r"output 'y' \[1, 1024, 8\] is not a classifier's") as e:
        load_model(issue, task="classify")
    assert str(issue) in str(e.value) and "task = \"detect\"" in str(e.value)
    with caplog.at_level(logging.INFO, "edgerun.model"):
        m = load_model(issue)  # auto: the shape says yolov5 with 3 classes, and the log says so
    assert m.detect == DetectSpec(format="yolov5") and m.labels == ("class_0", "class_1",
                                                                    "class_2")
    assert "[1, 1024, 8] looks like a yolov5 detector" in caplog.text
    declared = load_model(issue, task="detect", fmt="yolov8", score_threshold=0.5)
    assert declared.detect == DetectSpec(format="yolov8", score_threshold=0.5)
    odd = _raw_output_model(tmp_path / "odd.onnx", [1, 4, 4])
    with pytest.raises(ModelError, match=r"\[1, 4, 4\] is neither a classifier's"):
        load_model(odd)
    with pytest.raises(ModelError, match="3 outputs .*NMS inside.*models prepare"):
        load_model(tiny_detector(tmp_path / "e2e.onnx", "nms-inside"))
    with pytest.raises(ModelError, match="3 labels given but the output 'y' has 2 classes"):
        load_model(tiny_detector(tmp_path / "v8.onnx"), labels=("a", "b", "c"))
    assert load_model(tiny_cnn(tmp_path / "cls.onnx")).detect is None  # classifiers unchanged


@pytest.mark.parametrize(("post", "error"), [
    ({"task": "segment"}, "task must be one of"),
    ({"task": "detect", "format": "ssd"}, "format must be one of"),
    ({"task": "detect", "score_threshold": 2}, "score_threshold must be within"),
    ({"task": "detect", "iou": 0.5}, "unknown key"),
    ({"task": "detect", "max_detections": 0}, "max_detections"),
])
def test_manifest_postprocess_is_validated(tmp_path, post, error):
    tiny_cnn(tmp_path / "fp32.onnx")
    doc = {"schema": "edgerun.manifest/1", "name": "m", "labels": [], "preprocess": {},
           "output": "probabilities", "accuracy_basis": "labels", "eval_images": 0,
           "variants": [], "postprocess": post}
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=error) as e:
        load_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(e.value)


# -- models prepare ------------------------------------------------------------------------------

CELLS = [[(0, 0, 0), (2, 3, 1)], [(1, 1, 1)], [], [(3, 0, 0), (0, 3, 0), (2, 2, 1)],
         [(1, 2, 0)], [(3, 3, 1), (0, 1, 1)]]


def _val(root: Path, labelled: bool = True) -> Path:
    (root / "images").mkdir(parents=True)
    for i, cells in enumerate(CELLS):
        cv2.imwrite(str(root / "images" / f"{i}.png"), blob_frame((64, 64), cells))
        if labelled:
            (root / "labels").mkdir(exist_ok=True)
            (root / "labels" / f"{i}.txt").write_text("".join(
                f"{k} {(c + .5) / 4} {(r + .5) / 4} 0.25 0.25\n" for r, c, k in cells))
    return root


PIXELS = Preprocess(mean=(0, 0, 0), std=(1, 1, 1))  # what tiny_detector expects


@pytest.mark.parametrize("fmt", ["yolov8", "yolov5", "nms-inside"])
def test_prepare_measures_detector_rungs_by_map(tmp_path, fmt):
    val = _val(tmp_path / "val")
    out = tmp_path / "out"
    doc = prepare(tiny_detector(tmp_path / f"{fmt}.onnx", fmt), None, val, out,
                  PrepareOptions(name="blobs", preprocess=PIXELS, labels=("red", "green")))
    assert doc["postprocess"]["format"] == fmt and doc["postprocess"]["task"] == "detect"
    assert doc["accuracy_basis"] == "labels" and doc["accuracy_metric"] == "mAP@0.5"
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16", "int8"]
    for v in doc["variants"]:  # every box found, nothing else: mAP 1 against the label files
        assert v["accuracy"] == pytest.approx(1.0) and v["agreement"] == pytest.approx(1.0)
    assert [f["variant"] for f in doc["failed"]] == ["reduced"]
    m = load_manifest(out)
    assert m.detect.format == fmt
    # the served form: one output; the result has the boxes of the frame
    import onnxruntime as ort

    v = m.variant("int8")
    sess = ort.InferenceSession(str(m.path(v)), providers=["CPUExecutionProvider"])
    assert len(sess.get_outputs()) == 1
    frame = blob_frame((64, 64), [(2, 1, 1)])
    y = sess.run(None, {v.input_name: m.preprocess.apply(frame, v.input_shape)})[0]
    r = frame_result(y, m, frame.shape[:2], v.input_shape)
    assert r["counts"] == {"green": 1}
    box = r["boxes"][0]  # int8: within a quantization step of the cell at row 2, column 1
    assert (box["x"], box["y"], box["w"]) == pytest.approx((0.375, 0.625, 0.25), abs=0.01)


def test_prepare_detector_map_against_labels_sees_a_worse_model(tmp_path):
    # Labels that disagree with what the model finds (one class swapped on every box of the
    # first two images) lower the accuracy: the mAP is measured, not a constant.
    val = _val(tmp_path / "val")
    for i in (0, 1):
        f = val / "labels" / f"{i}.txt"
        f.write_text("".join(f"{1 - int(line[0])}{line[1:]}\n"
                             for line in f.read_text().splitlines()))
    doc = prepare(tiny_detector(tmp_path / "m.onnx"), None, val, tmp_path / "out",
                  PrepareOptions(name="blobs", preprocess=PIXELS, labels=("red", "green")))
    acc = doc["variants"][0]["accuracy"]
    assert 0.3 < acc < 0.95 and doc["variants"][0]["agreement"] == pytest.approx(1.0)


def test_prepare_detector_without_labels_is_map_against_fp32(tmp_path):
    val = _val(tmp_path / "val", labelled=False)
    doc = prepare(tiny_detector(tmp_path / "m.onnx"), None, val, tmp_path / "out",
                  PrepareOptions(name="blobs", preprocess=PIXELS))
    assert doc["accuracy_basis"] == "agreement" and doc["accuracy_metric"] == "mAP@0.5"
    assert all(v["accuracy"] == v["agreement"] for v in doc["variants"])
    assert doc["variants"][0]["accuracy"] == 1.0


def test_prepare_reads_the_issues_detector_shape_as_yolov5_not_a_classifier(tmp_path, caplog):
    # The issue: [1, 1024, 8] was scored as a 1024-way... 8-way classifier (int8 "0.3333").
    model = _raw_output_model(tmp_path / "issue.onnx", [1, 1024, 8])
    with caplog.at_level(logging.INFO):
        doc = prepare(model, None, None, tmp_path / "out",
                      PrepareOptions(name="issue", preprocess=PIXELS, generated=8,
                                     check_reference=False))  # its output is constant
    assert doc["postprocess"]["format"] == "yolov5" and doc["accuracy_metric"] == "mAP@0.5"
    assert doc["accuracy_basis"] == "agreement-generated"
    assert "[1, 1024, 8] looks like a yolov5 detector" in caplog.text


def test_prepare_refuses_a_detector_declared_a_classifier(tmp_path):
    from runtime.engine.prepare import StepError

    with pytest.raises(StepError, match=r"task: .*\[1, 6, 16\] is not a classifier's"):
        prepare(tiny_detector(tmp_path / "m.onnx"), None, _val(tmp_path / "val"),
                tmp_path / "out", PrepareOptions(name="m", preprocess=PIXELS, task="classify"))


def test_prepare_cli_for_a_detector(tmp_path):
    import subprocess
    import sys

    val = _val(tmp_path / "val")
    (tmp_path / "labels.txt").write_text("red\ngreen\n")
    (tmp_path / "pre.json").write_text(json.dumps({"mean": [0, 0, 0], "std": [1, 1, 1]}))
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare",
                        str(tiny_detector(tmp_path / "m.onnx", "yolov5")), "--val", str(val),
                        "--labels", str(tmp_path / "labels.txt"), "--preprocess",
                        str(tmp_path / "pre.json"), "--out", str(tmp_path / "out"),
                        "--task", "detect", "--format", "yolov5", "--score-threshold", "0.4"],
                       capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr
    assert "mAP@0.5 against the label files" in r.stdout
    assert json.loads((tmp_path / "out/manifest.json").read_text())["postprocess"][
        "score_threshold"] == 0.4


def test_an_output_not_of_the_declared_form_costs_that_frame_only(tmp_path):
    """A real Pipeline: a yolov8-form model declared yolov5 fails to decode on every frame;
    each is counted as postprocess_failed (one rate-limited event), none stored, the threads
    keep running; declared right, the next frames give boxes."""
    import time
    from dataclasses import replace

    from runtime.config import BackendsConfig, OnnxRuntimeConfig
    from runtime.config.source import SourceConfig
    from runtime.engine.backends import discover
    from runtime.engine.manifest import model_files
    from runtime.frames.pipeline import Active, Pipeline
    from runtime.frames.sources import open_source

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(4):
        cv2.imwrite(str(inbox / f"a{i}.png"), blob_frame((64, 64), [(1, 2, 0)]))
    right = load_model(tiny_detector(tmp_path / "d.onnx"), labels=("red", "green"))
    wrong = replace(right, detect=DetectSpec(format="yolov5"))
    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,), onnxruntime=OnnxRuntimeConfig(
        spinning=(False,), include_default=False))
    (backend,) = discover(bcfg)
    v = backend.variants(model_files(right)[0], bcfg, (1,))[0]
    stored: list[dict] = []
    evs: list[dict] = []

    def sink(rs: list[dict]) -> list[int]:
        stored.extend(rs)
        return list(range(len(rs)))

    p = Pipeline(lambda: open_source(SourceConfig(kind="folder", path=str(inbox)),
                                     tmp_path / "state"), wrong, sink, evs.append)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        deadline = time.monotonic() + 30
        while p.bad.counts()["postprocess_failed"] < 4:
            assert time.monotonic() < deadline, (p.bad.counts(), evs)
            time.sleep(0.02)
        assert stored == [] and p.alive(5.0)
        bad = [e for e in evs if e["type"] == "frame_bad"]
        assert len(bad) == 1 and "yolov5 output [1, 6, 16]" in bad[0]["error"]
        p.set_manifest(right)
        for i in range(2):
            cv2.imwrite(str(inbox / f"b{i}.png"), blob_frame((64, 64), [(1, 2, 0)]))
        while len(stored) < 2:
            assert time.monotonic() < deadline, (p.bad.counts(), evs)
            time.sleep(0.02)
    finally:
        p.stop()
    assert all(r["counts"] == {"red": 1} for r in stored)


def test_bundled_defect_detector_manifest():
    from models import bundled
    from runtime.engine.manifest import model_files

    root = bundled("defects")
    if not (root / "manifest.json").exists():
        pytest.skip("models/defects not built (python -m models.recipes.defects.build)")
    m = load_manifest(root)
    assert m.detect == DetectSpec(format="yolov8") and m.labels == ("scratch", "dent", "stain")
    doc = json.loads((root / "manifest.json").read_text())
    assert doc["accuracy_metric"] == "mAP@0.5" and doc["accuracy_basis"] == "labels"
    forms = model_files(m)  # sha256-verified
    assert [f.precision for f in forms] == ["fp32", "fp16", "int8"]
    assert all(0.3 < f.accuracy <= 1.0 for f in forms)


# -- end to end ----------------------------------------------------------------------------------

def test_a_prepared_yolo_detector_runs_from_prepare_to_boxes_at_the_coordinator(
        tmp_path, broker, coordinator):
    """prepare (mAP rungs) -> serve a folder of frames twice the input, tiled -> results with
    boxes in frame coordinates and per-label counts, stored by the coordinator."""
    from support.daemon_harness import Serve, write_broker_config
    from support.waiting import wait

    out = tmp_path / "blobs"
    doc = prepare(tiny_detector(tmp_path / "blobs.onnx"), None, _val(tmp_path / "val"), out,
                  PrepareOptions(name="blobs", preprocess=PIXELS, labels=("red", "green")))
    assert [v["accuracy"] for v in doc["variants"]] == [1.0, 1.0, 1.0]
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    scenes = {f"f{i}.png": cells for i, cells in enumerate(
        [[(1, 1, 0), (6, 5, 1)], [], [(7, 7, 1), (0, 4, 0), (3, 6, 0)]] * 4)}
    for name, cells in scenes.items():  # 128x128 frames, 16 px blobs: found only when tiled
        cv2.imwrite(str(inbox / name), blob_frame((128, 128), cells))
    cfg = write_broker_config(tmp_path, broker, tmp_path / "cache",
                       source=f'kind = "folder"\npath = "{inbox}"\nwatch = true',
                       extra=f'[model]\npath = "{out}"\ntiling = true\ntile_overlap = 0.25\n')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: coordinator.store.counts().get("box1", 0) >= len(scenes), 120,
             "every frame's result at the coordinator", d)
        rs = coordinator.store.results("box1", 0, 100)
    finally:
        assert d.stop() == 0
    assert sorted(r["ref"] for r in rs) == sorted(scenes)
    for r in rs:
        cells = scenes[r["ref"]]
        found = sorted((round(b["y"] * 8 - .5), round(b["x"] * 8 - .5), b["label"])
                       for b in r["boxes"])
        assert found == sorted((row, col, ("red", "green")[k]) for row, col, k in cells)
        want = {}
        for *_, k in cells:
            want[("red", "green")[k]] = want.get(("red", "green")[k], 0) + 1
        assert r["counts"] == want
        assert r["label"] == (r["boxes"][0]["label"] if cells else "none")
        assert r["variant"].startswith("blobs/")


def test_the_bundled_detector_tiled_on_two_sources_with_rois_prints_and_snapshots(tmp_path):
    """`serve --print` on models/defects, tiled, from two folder [[sources]] (each with an
    ROI), with a JSONL file and snapshots: every result has boxes and names its source in
    the outbox, the JSONL file and on stdout; a snapshot is kept for exactly the frames where
    something was found, whatever its label (was: the default "every label but the
    manifest's first" never kept a frame whose best box was a scratch, the detector's first
    label, and kept every frame where nothing was found, "none")."""
    import os
    import time

    from support.daemon_harness import Serve, results, write_config
    from support.waiting import wait

    from models import bundled
    from models.recipes.defects.data import mosaic

    if not (bundled("defects") / "manifest.json").exists():
        pytest.skip("models/defects not built (python -m models.recipes.defects.build)")
    srcs = []
    for k in range(2):
        inbox = tmp_path / f"inbox{k}"
        inbox.mkdir()
        for i in range(4):  # 192x192 mosaics of 96x96 parts: 2x2 tiles of the ROI
            cv2.imwrite(str(inbox / f"m{i}.png"), mosaic(seed=10 * k + i, grid=2).image)
        cv2.imwrite(str(inbox / "blank.png"), np.full((192, 192, 3), 128, np.uint8))
        old = time.time() - 10
        for f in inbox.iterdir():  # settled files (the folder source waits 1 s otherwise)
            os.utime(f, (old, old))
        srcs.append(f'[[sources]]\nname = "line{k}"\nkind = "folder"\npath = "{inbox}"\n'
                    f'rate_hz = 10\nroi = [0, 0, 0.75, 1]\nroi_units = "fraction"')
    cfg = write_config(tmp_path, tmp_path / "cache", source='kind = "synthetic"', extra=f"""
[model]
path = "{bundled('defects')}"
tiling = true
[results.jsonl]
path = "{tmp_path / 'r.jsonl'}"
[results.snapshots]
dir = "{tmp_path / 'snaps'}"
""")
    cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n',
                                           "\n".join(srcs) + "\n"))
    d = Serve(tmp_path, cfg, args=("--print",), stdout=tmp_path / "stdout.txt")
    try:
        wait(lambda: len(results(d.outbox)) >= 10, 120, "every frame's result", d)
    finally:
        assert d.stop() == 0
    rs = results(d.outbox)
    assert sorted((r["source"], r["ref"]) for r in rs) == sorted(
        (f"line{k}", n) for k in range(2) for n in ("blank.png", "m0.png", "m1.png", "m2.png",
                                                    "m3.png"))
    assert all(r["variant"].startswith("defects/") and "boxes" in r for r in rs)
    for r in rs:
        assert r["label"] == (r["boxes"][0]["label"] if r["boxes"] else "none"), r
        assert all(0 <= b["x"] <= 1 and 0 <= b["y"] <= 1 for b in r["boxes"]), r
    found = {r["ref"] + r["source"] for r in rs if r["label"] != "none"}
    assert {r["label"] for r in rs} >= {"scratch", "none"}  # what this test is about
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(x["seq"] for x in lines) == sorted(range(1, len(rs) + 1))
    assert all("boxes" in x and x["source"] in ("line0", "line1") for x in lines)
    printed = (tmp_path / "stdout.txt").read_text().splitlines()
    assert sorted(p.split()[1] for p in printed) == sorted(f"{r['source']}/{r['ref']}"
                                                           for r in rs)
    sidecars = [json.loads(f.read_text()) for f in (tmp_path / "snaps").glob("*.json")]
    assert sorted(s["ref"] + s["source"] for s in sidecars) == sorted(found)
    assert len(list((tmp_path / "snaps").glob("*.jpg"))) == len(found)
