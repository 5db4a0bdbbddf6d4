"""Detector rungs that keep their value: int8 with the box decoding left in float (nodes found
from the graph, each candidate measured, the search in the manifest) and several input
resolutions as rungs (runtime/engine/int8_search.py, prepare/)."""

from __future__ import annotations

from pathlib import Path

import cv2
import onnx
import pytest

from runtime.engine.int8_search import decode_tail, name_nodes
from runtime.engine.manifest import load_manifest
from runtime.engine.prepare import PrepareOptions, detector_sizes, generated_frames, prepare


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import first_decision

    return first_decision


def test_the_decode_tail_and_head_are_found_from_the_graph(tmp_path, bench):
    proto = onnx.load(str(bench.detector_model(tmp_path / "d.onnx", hw=64, width=4,
                                               dynamic=True)))
    assert name_nodes(proto) == len(proto.graph.node)  # the bench export names none
    tail, head = decode_tail(proto)
    ops = {n.name: n.op_type for n in proto.graph.node}
    assert {ops[t] for t in tail} == {"Concat", "Slice", "Sigmoid", "Mul", "Sub", "Reshape",
                                      "Shape", "Gather", "Cast"}
    # the head: the three 1x1 prediction convolutions (strides 8, 16, 32), nothing else
    convs = [n for n in proto.graph.node if n.name in head]
    assert len(convs) == 3 and all(n.op_type == "Conv" for n in convs)
    assert all(n.input[1].endswith("o_w") for n in convs)


@pytest.mark.parametrize("hw, multiple, want", [
    ((320, 320), 32, [(256, 256), (224, 224), (160, 160)]),
    ((640, 480), 32, [(512, 384), (448, 320), (320, 256)]),
    ((128, 128), 32, [(96, 96), (64, 64)]),
    ((96, 96), 32, [(64, 64)]),
    ((64, 64), 32, []),  # nothing smaller than 2 strides: the one 2/3 form instead
])
def test_detector_sizes(hw, multiple, want):
    assert detector_sizes(hw, multiple) == want


def test_a_detector_ladder_keeps_int8_and_several_resolutions(tmp_path, bench):
    """The bench detector (YOLOv8-shaped, three strides, dynamic reshapes): plain int8 loses
    nearly every detection (one scale for pixel boxes and 0..1 scores); with the decoding in
    float it keeps them; 96 and 64 px forms are rungs too."""
    src = bench.detector_model(tmp_path / "d.onnx", hw=128, width=8, dynamic=True)
    val = tmp_path / "val"
    val.mkdir()
    for i, img in enumerate(generated_frames((128, 128), 32, seed=2)):
        cv2.imwrite(str(val / f"{i:03d}.png"), img)
    doc = prepare(src, None, val, tmp_path / "out",
                  PrepareOptions(name="d", labels=tuple(bench.DETECTOR_CLASSES)))
    rungs = {v["name"]: v for v in doc["variants"]}
    assert list(rungs) == ["fp32", "fp16", "int8", "fp32-r96", "fp32-r64"], doc["failed"]
    search = doc["int8_search"]["d.onnx"]
    first = search[0]
    assert (first["exclude"], first["method"]) == ("none", "MinMax")
    assert first["accuracy"] < 0.5  # int8 all the way to the output: most boxes gone
    tail = [c for c in search if c["exclude"] == "tail"]
    assert tail and tail[0]["accuracy"] >= 0.8 and tail[0]["nodes"] > 0
    assert {c["method"] for c in tail} == {"MinMax", "Percentile", "Entropy"}  # measured
    best = max(c["accuracy"] for c in search)
    assert rungs["int8"]["accuracy"] == pytest.approx(best, abs=1e-4)
    assert all(rungs[r]["accuracy"] >= 0.8 for r in ("fp32-r96", "fp32-r64"))
    m = load_manifest(tmp_path / "out")
    assert m.variant("fp32-r64").input_shape == (1, 3, 64, 64)
