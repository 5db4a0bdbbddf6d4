"""Review R4 of the detector ladder (H27)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_detector_ladder import ladder  # noqa: F401 (fixture)

from runtime.engine.manifest import load_manifest
from runtime.engine.prepare import reduced_hw


def test_a_prefix_model_at_the_reduced_size_cuts_its_own_tiles(ladder):  # noqa: F811
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
    from test_detector_ladder import PIXELS, _val

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
