"""A detector's full ladder: the reduced-resolution rung (made and measured when the graph runs
at the smaller size, skipped naming the node when it does not) and the accuracy floor that
keeps useless forms off the ladder (docs/detectors.md "models prepare for a detector")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save
from support.modelgen import tiny_detector

from runtime.engine.detection import form_change
from runtime.engine.manifest import Preprocess, frame_result, load_manifest
from runtime.engine.prepare import PrepareOptions, below_floor, prepare, reduced_hw
from runtime.engine.tiling import Tiler, TileSpec, infer_tiles, tile_grid

PIXELS = Preprocess(mean=(0, 0, 0), std=(1, 1, 1))  # pixels / 255, RGB: what the models expect
LABELS = ("red", "green")
SIDE = 24  # object side in frame pixels


def fcn_detector(path: Path, hw: tuple[int, int] = (96, 96), stride: int = 8,
                 window: int = 48, classes: int = 2, fixed_scale: bool = False) -> Path:
    """A fully convolutional YOLOv8-form detector of coloured squares, as a dynamic-axes export
    is: it runs at any input size, its candidate count follows the size, and its boxes are in
    the input's pixels. Per pixel, class c's mask is sigmoid(20 * channel c - 10 * the others
    - 8) (red, green at 0..1 scale); one candidate per stride x stride cell, scoring each class
    by its mask's mean over the cell; the box is the centroid and extent (uniform: w =
    sqrt(12 var)) of all classes' masks in a `window` around the cell. Pixel coordinates come
    from CumSum over a map of ones, the final reshape to [1, 4 + C, N] from Shape and -1:
    nothing in the graph is fixed to the input's size. `fixed_scale`: boxes in the pixels of
    the `hw` input whatever size it runs at (x `hw` width / the input's width), as a model
    that normalises and rescales by a constant would give them."""
    h, w = hw
    pad = (window - stride) // 2
    wc = np.full((classes, 3, 1, 1), -10.0, np.float32)
    for c in range(classes):
        wc[c, c] = 20.0
    f = np.float32
    inits = [numpy_helper.from_array(wc, "wc"),
             numpy_helper.from_array(np.full(classes, -8.0, f), "bc"),
             numpy_helper.from_array(np.zeros((1, 3, 1, 1), f), "w_one"),
             numpy_helper.from_array(np.ones(1, f), "b_one"),
             numpy_helper.from_array(np.ones((1, classes, 1, 1), f), "w_sum"),
             numpy_helper.from_array(np.array(2, np.int64), "ax_y"),
             numpy_helper.from_array(np.array(3, np.int64), "ax_x"),
             numpy_helper.from_array(np.array(0.5, f), "half"),
             numpy_helper.from_array(np.array(1e-6, f), "eps"),
             numpy_helper.from_array(np.array(12.0, f), "twelve"),
             numpy_helper.from_array(np.array(0.0, f), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "i0"),
             numpy_helper.from_array(np.array([1], np.int64), "i1"),
             numpy_helper.from_array(np.array([4 + classes, -1], np.int64), "rows_rest")]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w_one", "b_one"], ["ones"]),  # [1, 1, H, W] of 1
        n("CumSum", ["ones", "ax_x"], ["xi"]), n("Sub", ["xi", "half"], ["X"]),
        n("CumSum", ["ones", "ax_y"], ["yi"]), n("Sub", ["yi", "half"], ["Y"]),
        n("Conv", ["x", "wc", "bc"], ["logit"]), n("Sigmoid", ["logit"], ["mask"]),
        n("Conv", ["mask", "w_sum"], ["m"]),  # any class: [1, 1, H, W]
        n("Mul", ["m", "X"], ["mx"]), n("Mul", ["m", "Y"], ["my"]),
        n("Mul", ["mx", "X"], ["mxx"]), n("Mul", ["my", "Y"], ["myy"]),
        n("Concat", ["m", "mx", "my", "mxx", "myy"], ["moments"], axis=1),
        n("AveragePool", ["moments"], ["pooled"], kernel_shape=[window, window],
          strides=[stride, stride], pads=[pad] * 4, count_include_pad=0),
        n("Split", ["pooled"], ["p0", "p1", "p2", "p3", "p4"], axis=1, num_outputs=5),
        n("Add", ["p0", "eps"], ["p0e"]),
        n("Div", ["p1", "p0e"], ["cx"]), n("Div", ["p2", "p0e"], ["cy"]),
        n("Div", ["p3", "p0e"], ["ex2"]), n("Div", ["p4", "p0e"], ["ey2"]),
        n("Mul", ["cx", "cx"], ["cx2"]), n("Mul", ["cy", "cy"], ["cy2"]),
        n("Sub", ["ex2", "cx2"], ["vx"]), n("Sub", ["ey2", "cy2"], ["vy"]),
        n("Max", ["vx", "zero"], ["vx0"]), n("Max", ["vy", "zero"], ["vy0"]),
        n("Mul", ["vx0", "twelve"], ["vx12"]), n("Mul", ["vy0", "twelve"], ["vy12"]),
        n("Sqrt", ["vx12"], ["bw"]), n("Sqrt", ["vy12"], ["bh"]),
        n("AveragePool", ["mask"], ["cls"], kernel_shape=[stride, stride],
          strides=[stride, stride]),
        n("Concat", ["cx", "cy", "bw", "bh"], ["box_px"], axis=1),
    ]
    if fixed_scale:
        inits += [numpy_helper.from_array(np.array(3, np.int64), "i3"),
                  numpy_helper.from_array(np.array(float(w), f), "w_full")]
        nodes += [n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "i3"], ["w_in"]),
                  n("Cast", ["w_in"], ["w_inf"], to=TensorProto.FLOAT),
                  n("Div", ["w_full", "w_inf"], ["rescale"]),
                  n("Mul", ["box_px", "rescale"], ["box"])]
    else:
        nodes.append(n("Identity", ["box_px"], ["box"]))
    nodes += [
        n("Concat", ["box", "cls"], ["grid"], axis=1),  # [1, 4 + C, gh, gw]
        n("Shape", ["x"], ["xshape"]), n("Slice", ["xshape", "i0", "i1"], ["batch"]),
        n("Concat", ["batch", "rows_rest"], ["target"], axis=0),
        n("Reshape", ["grid", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "fcn_detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [1, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [1, 4 + classes, (h // stride) * (w // stride)])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="edgerun-tests")
    model.ir_version = 8
    save(model, str(path))
    return path


def squares_frame(hw: tuple[int, int], objects: list[tuple[int, int, int]],
                  side: int = SIDE) -> np.ndarray:
    """A grey BGR frame with pure-colour side x side squares: (x0, y0, class) each, class 0
    red, 1 green."""
    f = np.full((*hw, 3), 90, np.uint8)
    for x0, y0, k in objects:
        f[y0:y0 + side, x0:x0 + side] = 0
        f[y0:y0 + side, x0:x0 + side, 2 - k] = 255  # BGR
    return f


def _scenes(n: int, seed: int = 0) -> list[list[tuple[int, int, int]]]:
    """`n` scenes of 0-2 squares in a 96x96 frame, far enough apart for the detector's
    window to see one at a time."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        objs: list[tuple[int, int, int]] = []
        for _ in range(int(rng.integers(0, 3))):
            for _ in range(20):
                x0, y0 = (int(v) for v in rng.integers(0, 96 - SIDE, 2))
                if all(max(abs(x0 - a), abs(y0 - b)) >= 48 for a, b, _ in objs):
                    objs.append((x0, y0, int(rng.integers(0, 2))))
                    break
        out.append(objs)
    return out


def _val(root: Path, n: int = 24, labelled: bool = True) -> Path:
    (root / "images").mkdir(parents=True)
    for i, objs in enumerate(_scenes(n)):
        cv2.imwrite(str(root / "images" / f"{i:02d}.png"), squares_frame((96, 96), objs))
        if labelled:
            (root / "labels").mkdir(exist_ok=True)
            (root / "labels" / f"{i:02d}.txt").write_text("".join(
                f"{k} {(x0 + SIDE / 2) / 96} {(y0 + SIDE / 2) / 96} {SIDE / 96} {SIDE / 96}\n"
                for x0, y0, k in objs))
    return root


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """The fully convolutional detector prepared against labelled val images."""
    root = tmp_path_factory.mktemp("fcn")
    out = root / "squares"
    doc = prepare(fcn_detector(root / "squares.onnx"), None, _val(root / "val"), out,
                  PrepareOptions(name="squares", preprocess=PIXELS, labels=LABELS))
    return out, doc


def test_a_fully_convolutional_detector_gets_a_measured_reduced_rung(ladder):
    out, doc = ladder
    v = {e["name"]: e for e in doc["variants"]}
    assert "fp32" in v and "fp32-r64" in v, doc["failed"]
    assert v["fp32"]["accuracy"] > 0.9  # the squares are found at full resolution
    # int8 all the way to the output finds nothing (its moment maps do not survive 8 bits:
    # mAP 0.0); with the decoding left in float it keeps fp32's (runtime/engine/int8_search.py)
    search = doc["int8_search"]["squares.onnx"]
    assert search[0]["exclude"] == "none" and search[0]["accuracy"] < 0.1
    assert v["int8"]["accuracy"] > 0.9 and v["int8"]["accuracy"] == max(
        c["accuracy"] for c in search)
    r = v["fp32-r64"]
    assert r["input_shape"] == [1, 3, 64, 64] and r["precision"] == "fp32-reduced"
    # mAP@0.5 against the label files, with boxes normalised by the 64x64 input: scaled by
    # fp32's 96 instead, every box would sit at 2/3 of its place and match nothing
    assert r["accuracy"] > 0.9 and r["agreement"] > 0.9
    assert r["max_abs_diff"] is None and r["mean_abs_diff"] is None  # other candidates
    assert doc["accuracy_metric"] == "mAP@0.5" and doc["accuracy_basis"] == "labels"
    assert not [f for f in doc["failed"] if f["variant"] == "reduced"]
    m = load_manifest(out)  # loads, sha256-verified entry, the declared output is the real one
    sess = ort.InferenceSession(str(m.path(m.variant("fp32-r64"))),
                                providers=["CPUExecutionProvider"])
    assert sess.get_outputs()[0].shape == [1, 6, 64]  # 8x8 cells of stride 8, not 12x12
    y = sess.run(None, {"x": np.zeros((1, 3, 64, 64), np.float32)})[0]
    assert y.shape == (1, 6, 64)


def test_a_reduced_form_whose_boxes_keep_the_full_input_scale_is_measured_off_the_ladder(
        tmp_path):
    """Runs at 64x64 and keeps the detector's form, but its boxes are in the 96 px input's
    pixels: normalised by 64 they land at 1.5x their place. The measurement sees it (mAP
    far below fp32's) and the floor keeps it off the ladder."""
    doc = prepare(fcn_detector(tmp_path / "m.onnx", fixed_scale=True), None,
                  _val(tmp_path / "val"), tmp_path / "out",
                  PrepareOptions(name="s", preprocess=PIXELS, labels=LABELS))
    v = {e["name"]: e for e in doc["variants"]}
    assert v["fp32"]["accuracy"] > 0.9 and "fp32-r64" not in v
    (f,) = [f for f in doc["failed"] if f["variant"] == "fp32-r64"]
    assert f["step"] == "reduced" and f["accuracy"] < 0.2 and "below the floor" in f["error"]


def test_the_reduced_rung_boxes_land_where_the_object_is(ladder):
    out, _ = ladder
    m = load_manifest(out)
    frame = squares_frame((96, 96), [(56, 16, 1)])  # centre (68, 28) of 96
    for name in ("fp32", "fp32-r64"):
        v = m.variant(name)
        sess = ort.InferenceSession(str(m.path(v)), providers=["CPUExecutionProvider"])
        y = sess.run(None, {v.input_name: m.preprocess.apply(frame, v.input_shape)})[0]
        r = frame_result(y, m, frame.shape[:2], v.input_shape)
        assert r["counts"] == {"green": 1}, (name, r)
        b = r["boxes"][0]
        assert (b["x"], b["y"], b["w"], b["h"]) == pytest.approx(
            (68 / 96, 28 / 96, SIDE / 96, SIDE / 96), abs=0.02), name


def test_every_rung_cuts_a_large_frame_into_the_same_tiles(ladder):
    """Tiling with tile_size 0: tiles are the full-resolution input's size for every rung, so
    the reduced rung resizes each tile down; cutting 64 px tiles instead would cost 16
    inferences where fp32 costs 9, no saving per frame."""
    out, _ = ladder
    m = load_manifest(out)
    from dataclasses import replace

    m = replace(m, tiling=TileSpec(overlap=0.2))
    # tiles start at 0, 48 and 96 each way: no square is cut by a tile edge (a cut one is a
    # partial view in one tile: the merge's business, tests/engine/test_tiling.py)
    frame = squares_frame((192, 192), [(20, 20, 0), (150, 60, 1), (70, 150, 0)])
    want = sorted(((x0 + SIDE / 2) / 192, (y0 + SIDE / 2) / 192, LABELS[k])
                  for x0, y0, k in [(20, 20, 0), (150, 60, 1), (70, 150, 0)])
    counts = {}
    for name in ("fp32", "fp32-r64"):
        v = m.variant(name)
        assert m.tile_hw(v.input_shape) == (96, 96)
        sess = ort.InferenceSession(str(m.path(v)), providers=["CPUExecutionProvider"])

        class Session:  # the engine Session interface: first output only
            def infer(self, x, sess=sess, v=v):
                return sess.run(None, {v.input_name: x})[0]

        batch = Tiler(m.preprocess.apply, m.tiling, m.tile_hw)(frame, v.input_shape)
        counts[name] = len(batch)
        assert batch.shape[2:] == tuple(v.input_shape[2:])
        r = frame_result(infer_tiles(Session(), batch), m, frame.shape[:2], v.input_shape)
        got = sorted((b["x"], b["y"], b["label"]) for b in r["boxes"])
        assert [g[2] for g in got] == [w[2] for w in want], (name, r["boxes"])
        for g, w in zip(got, want, strict=True):
            assert g[:2] == pytest.approx(w[:2], abs=0.02), name
    assert counts == {"fp32": 9, "fp32-r64": 9}
    assert len(tile_grid((192, 192), (64, 64), m.tiling)) == 16  # what the rung's own size cuts


def test_the_reduced_rung_serves_end_to_end(ladder, tmp_path):
    """`serve` on a ladder of the reduced rung alone: results from fp32-r64 with the box of
    each frame's square where it is."""
    import os
    import time

    from support.daemon_harness import Serve, results, write_config
    from support.waiting import wait

    src, _ = ladder
    only = tmp_path / "squares"
    only.mkdir()
    shutil.copy(src / "fp32-r64.onnx", only)
    man = json.loads((src / "manifest.json").read_text())
    man["variants"] = [v for v in man["variants"] if v["name"] == "fp32-r64"]
    (only / "manifest.json").write_text(json.dumps(man))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    scenes = {"a.png": [(56, 16, 1)], "b.png": [(8, 60, 0)], "c.png": [],
              "d.png": [(4, 4, 0), (68, 68, 1)]}  # apart by more than the model's window
    for name, objs in scenes.items():
        cv2.imwrite(str(inbox / name), squares_frame((96, 96), objs))
    old = time.time() - 10
    for f in inbox.iterdir():  # settled files (the folder source waits 1 s otherwise)
        os.utime(f, (old, old))
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source=f'kind = "folder"\npath = "{inbox}"',
                       extra=f'[model]\npath = "{only}"\n')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(results(d.outbox)) >= len(scenes), 120, "every frame's result", d)
    finally:
        assert d.stop() == 0
    rs = results(d.outbox)
    assert sorted(r["ref"] for r in rs) == sorted(scenes)
    for r in rs:
        assert r["variant"].startswith("squares/fp32-r64@"), r
        got = sorted((b["x"], b["y"], b["label"]) for b in r["boxes"])
        want = sorted(((x0 + SIDE / 2) / 96, (y0 + SIDE / 2) / 96, LABELS[k])
                      for x0, y0, k in scenes[r["ref"]])
        assert [g[2] for g in got] == [w[2] for w in want], r
        for g, w in zip(got, want, strict=True):
            assert g[:2] == pytest.approx(w[:2], abs=0.02), r


def test_a_fixed_reshape_detector_gets_the_skip_reason_naming_the_node(tmp_path):
    val = tmp_path / "val"
    (val / "images").mkdir(parents=True)
    for i in range(4):
        cv2.imwrite(str(val / "images" / f"{i}.png"), np.full((64, 64, 3), 40 * i, np.uint8))
    doc = prepare(tiny_detector(tmp_path / "fixed.onnx", hw=(96, 96)), None, val,
                  tmp_path / "out", PrepareOptions(name="fixed", preprocess=PIXELS,
                                                   labels=LABELS,
                                                   # flat grey images: a constant output
                                                   check_reference=False))
    assert "fp32-r64" not in [v["name"] for v in doc["variants"]]
    (skip,) = [f for f in doc["failed"] if f["variant"] == "reduced"]
    assert skip["skipped"] is True and skip["step"] == "reduced"
    assert skip["error"].startswith("skipped: the graph does not run at 64x64: Reshape node "
                                    "(unnamed, output 'logit_n'): The input tensor cannot be "
                                    "reshaped to the requested shape"), skip["error"]
    assert not (tmp_path / "out" / "reduced.onnx").exists()


@pytest.mark.parametrize("full, other, fmt, classes, why", [
    ((1, 6, 144), (1, 6, 64), "yolov8", None, None),  # fewer candidates: the same form
    ((1, 6, 144), (1, 6, 64), "yolov8", 2, None),
    ((1, 144, 6), (1, 64, 6), "yolov8", 2, None),  # transposed export
    ((1, 6, 144), (1, 6, 4), "yolov8", None, "too few to tell them"),  # axes swap meaning
    ((1, 6, 144), (1, 7, 64), "yolov8", None, "box+class rows change"),
    ((1, 144, 8), (1, 64, 8), "yolov5", None, None),
    ((1, 144, 8), (1, 64, 9), "yolov5", None, "last axis changes"),
    ((1, 100, 6), (1, 100, 6), "nms-inside", None, None),
    ((1, 100, 6), (1, 6, 100), "nms-inside", None, "last axis changes"),
    ((1, 6, 144), (1, 6, 8, 8), "yolov8", None, "rank or batch"),
])
def test_detector_form_at_another_resolution(full, other, fmt, classes, why):
    got = form_change(full, other, fmt, classes)
    assert (got is None) if why is None else (why in got), got


# -- the accuracy floor ----------------------------------------------------------------------

@pytest.mark.parametrize("acc, ref, ratio, floor", [
    (0.056, 1.0, 0.5, 0.5),  # the random-weight bench detector's int8: off
    (0.6143, 0.7032, 0.5, None),  # the bundled detector's int8 (0.87 of fp32): kept
    (0.8635, 0.9900, 0.5, None),  # the bundled classifier's fp32-r52 (0.87): kept
    (0.5225, 0.9950, 0.5, None),  # PP-OCR's 32 px form (0.525): kept, just
    (0.35, 0.70, 0.5, None),  # exactly at the floor: kept
    (0.3499, 0.70, 0.5, 0.35),
    (0.0, 1.0, 0.0, None),  # ratio 0 keeps everything
    (0.9, 1.0, 1.0, 1.0),  # ratio 1: only forms as good as fp32
    (0.0, 0.0, 0.5, None),  # fp32 itself finds nothing: no floor to miss
])
def test_below_floor(acc, ref, ratio, floor):
    got = below_floor(acc, ref, ratio)
    assert got == (None if floor is None else pytest.approx(floor))


def test_prepare_cli_prints_a_form_below_the_floor_as_skipped(tmp_path):
    """The detector whose boxes keep the full input's scale: its 64-px form finds almost
    nothing (mAP far below fp32's 1.0): at the default floor it is not written as a rung and
    the CLI says so with both figures; --min-accuracy-ratio 0 keeps it. (This test used int8,
    which found nothing before int8 left the box decoding in float.)"""
    val = _val(tmp_path / "val", n=8)
    (tmp_path / "labels.txt").write_text("red\ngreen\n")
    (tmp_path / "pre.json").write_text(json.dumps({"mean": [0, 0, 0], "std": [1, 1, 1]}))
    model = fcn_detector(tmp_path / "m.onnx", fixed_scale=True)

    def cli(out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", "models", "prepare", str(model), "--val",
             str(val), "--labels", str(tmp_path / "labels.txt"), "--preprocess",
             str(tmp_path / "pre.json"), "--out", str(out), *extra],
            capture_output=True, text=True, timeout=180, check=False)

    run = cli(tmp_path / "out")
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "out/manifest.json").read_text())
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16", "int8"]
    (f,) = [f for f in doc["failed"] if f["variant"] == "fp32-r64"]
    assert f["skipped"] is True and f["accuracy"] < 0.2 and f["floor"] == 0.5
    assert (f"SKIPPED m.onnx fp32-r64 (step reduced): skipped: mAP@0.5 {f['accuracy']:.4f} is "
            "below the floor 0.5000 (0.5 x fp32's 1.0000, --min-accuracy-ratio): not written "
            "as a rung") in run.stdout, run.stdout
    assert not (tmp_path / "out" / "fp32-r64.onnx").exists()
    assert "fp32-r64" not in [v.name for v in load_manifest(tmp_path / "out").variants]

    run = cli(tmp_path / "all", "--min-accuracy-ratio", "0")
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "all/manifest.json").read_text())
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16", "int8", "fp32-r64"]
    bad = cli(tmp_path / "bad", "--min-accuracy-ratio", "1.5")
    assert bad.returncode == 2 and "must be within 0..1" in bad.stderr


def test_the_bench_detector_as_a_dynamic_export_gets_a_reduced_rung(tmp_path, monkeypatch):
    """bench/first_decision.py's YOLOv8-shaped detector (three strides, concatenated heads):
    built with fixed reshapes its reduced form is skipped naming the head's Reshape; as a
    dynamic-axes export (-1 candidates, box scale from the input's Shape) it gets one, whose
    boxes are in its own input's pixels."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import first_decision as bench

    from runtime.engine.prepare import generated_frames

    val = tmp_path / "val"
    val.mkdir()
    for i, img in enumerate(generated_frames((64, 64), 4, seed=2)):
        cv2.imwrite(str(val / f"{i}.png"), img)
    opts = PrepareOptions(name="d", preprocess=Preprocess(), min_accuracy_ratio=0.0,
                          labels=tuple(bench.DETECTOR_CLASSES),
                          check_reference=False)  # random weights: no box on 4 images
    fixed = prepare(bench.detector_model(tmp_path / "fixed.onnx", hw=64, width=4), None, val,
                    tmp_path / "fixed", opts)
    (skip,) = [f for f in fixed["failed"] if f["variant"] == "reduced"]
    assert "the graph does not run at 32x32" in skip["error"] and "Reshape" in skip["error"]
    dyn = prepare(bench.detector_model(tmp_path / "dyn.onnx", hw=64, width=4, dynamic=True),
                  None, val, tmp_path / "dyn", opts)
    v = {e["name"]: e for e in dyn["variants"]}
    assert v["fp32-r32"]["input_shape"] == [1, 3, 32, 32] and not dyn["failed"]
    m = load_manifest(tmp_path / "dyn")
    sess = ort.InferenceSession(str(m.path(m.variant("fp32-r32"))),
                                providers=["CPUExecutionProvider"])
    y = sess.run(None, {"images": np.zeros((1, 3, 32, 32), np.float32)})[0]
    assert y.shape == (1, 7, 16 + 4 + 1)  # 4x4 + 2x2 + 1x1 cells at strides 8, 16, 32
    # zero input, zero biases: every box value is sigmoid(0) x the input width, 0.5 x 32
    assert np.allclose(y[0, :4], 16.0)


# -- edges found in review: reduced sizes and tiles ---------------------------------------

def test_a_prefix_model_at_the_reduced_size_cuts_its_own_tiles(ladder):
    """Old code: Manifest.tile_hw gathered the sources of every variant of the shape: a
    `--prefix` model made at the size another model's reduced form has (a YOLO at 416 beside
    one at 640, whose reduced form is 416) cut tiles at the other model's 640 and resized
    each down to 416: every tiled frame it saw was scaled by 2/3, which its measurement
    (whole val images) never showed. Its own full size wins now; a reduced rung alone
    still cuts the full-resolution tiles."""
    out, _ = ladder
    m = load_manifest(out)
    r64 = m.variant("fp32-r64")
    assert m.tile_hw(r64.input_shape) == (96, 96)  # the reduced rung alone: full tiles
    small = replace(r64, name="small-fp32", source="small.onnx")
    small_r = replace(r64, name="small-fp32-r32", source="small.onnx", input_shape=(1, 3, 32, 32))
    m2 = replace(m, variants=(*m.variants, small, small_r))
    assert m2.tile_hw(small.input_shape) == (64, 64)
    assert m2.tile_hw(small_r.input_shape) == (64, 64)  # the small model's reduced rung
    assert m2.tile_hw(m.variant("fp32").input_shape) == (96, 96)


@pytest.mark.parametrize("hw, multiple, want", [
    ((12, 96), 8, (12, 64)),  # old: (16, 64): the reduced form 16 px tall, the model 12
    ((8, 8), 8, (8, 8)),
    ((96, 20), 32, (64, 20)),  # old: (64, 32)
    ((640, 480), 32, (416, 320)),
    ((100, 100), 8, (64, 64)),
])
def test_reduced_hw_never_grows_a_side(hw, multiple, want):
    """Old code: a side under 16 (or under `multiple`) came out larger than the model's own:
    a "reduced" rung taller (or wider) than the full-resolution form, named r16 for a 12 px
    model."""
    assert reduced_hw(hw, multiple) == want


def _whole_frame_nms_detector(path):
    """An NMS-inside detector ([1, K, 6], K fixed at 1) that runs at any input size and
    finds the whole input: x1 y1 x2 y2 = 0 0 W H in the input's pixels, score 0.9, class 0."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    n = helper.make_node
    inits = [numpy_helper.from_array(np.array([2], np.int64), "s2"),
             numpy_helper.from_array(np.array([4], np.int64), "s4"),
             numpy_helper.from_array(np.array([1, 0], np.int64), "wh"),
             numpy_helper.from_array(np.zeros(2, np.float32), "origin"),
             numpy_helper.from_array(np.array([0.9, 0.0], np.float32), "tail"),
             numpy_helper.from_array(np.array([1, 1, 6], np.int64), "out_shape")]
    nodes = [n("Shape", ["x"], ["s"]), n("Slice", ["s", "s2", "s4"], ["hw_i"]),
             n("Cast", ["hw_i"], ["hw_f"], to=TensorProto.FLOAT),
             n("Gather", ["hw_f", "wh"], ["wh_f"]),
             n("Concat", ["origin", "wh_f", "tail"], ["row"], axis=0),
             n("Reshape", ["row", "out_shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "whole", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    save(model, str(path))
    return path


def test_an_nms_inside_reduced_rung_has_no_raw_difference(tmp_path):
    """Old code: the raw output difference from fp32 was left out only when the output's
    shape changed; an NMS-inside model's [1, K, 6] keeps its shape at another resolution,
    so its reduced rung was listed with fp32's 96 px boxes subtracted from its own 64 px
    ones (max |diff| 32 for the very same detection, agreement 1.0)."""

    from runtime.engine.prepare import PrepareOptions, prepare

    doc = prepare(_whole_frame_nms_detector(tmp_path / "whole.onnx"), None,
                  _val(tmp_path / "val", 6, labelled=False), tmp_path / "out",
                  PrepareOptions(name="whole", preprocess=PIXELS, labels=("a",), task="detect",
                                 format="nms-inside",
                                 check_reference=False))  # one box, the same for all
    rungs = {v["name"]: v for v in doc["variants"]}
    assert "fp32-r64" in rungs, doc["failed"]
    assert rungs["fp32-r64"]["agreement"] == 1.0
    assert rungs["fp32-r64"]["max_abs_diff"] is None
    assert rungs["fp32-r64"]["mean_abs_diff"] is None
    assert rungs["fp32"]["max_abs_diff"] == 0.0
