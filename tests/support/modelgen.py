"""Small ONNX models built in the tests (real graphs, random weights, fixed seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_cnn(path: Path, *, batch: int | str = "N", hw: tuple[int | str, int | str] = (32, 32),
             classes: int = 5, extra_op: str | None = None, seed: int = 0) -> Path:
    """Conv-BN-Relu-MaxPool-Conv(grouped)-Relu-GAP-Flatten-Gemm-Softmax, input [batch,3,H,W].

    `extra_op` appends a unary op (e.g. "Hardmax") after Softmax, to exercise backends that
    lack it.
    """
    rng = np.random.default_rng(seed)
    inits = [
        _w(rng, "c1w", (8, 3, 3, 3)), _w(rng, "c1b", (8,)),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bns"),
        _w(rng, "bnb", (8,)), _w(rng, "bnm", (8,), 0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bnv"),
        _w(rng, "c2w", (16, 4, 3, 3)), _w(rng, "c2b", (16,)),
        _w(rng, "fcw", (classes, 16)), _w(rng, "fcb", (classes,)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bns", "bnb", "bnm", "bnv"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1], group=2,
                         strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs" if extra_op else "y"], axis=1),
    ]
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["probs"], ["y"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, *hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])
    graph = helper.make_graph(nodes, "tiny_cnn", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="edgerun-tests")
    model.ir_version = 8
    save(model, str(path))
    return path


def tiny_detector(path: Path, fmt: str = "yolov8", *, hw: tuple[int, int] = (64, 64),
                  stride: int = 16, classes: int = 2, opset: int = 17) -> Path:
    """A colour-blob detector with a real YOLO-form output: each stride x stride cell is one
    candidate whose box is the cell and whose class c scores high when the cell is mostly
    colour channel c (after RGB conversion: class 0 red, 1 green, 2 blue) at 0..1 pixel scale
    (the bare-.onnx default preprocessing). `fmt`: "yolov8" -> [1, 4+C, N] (cx, cy, w, h in
    pixels); "yolov5" -> [1, N, 5+C] (objectness 1); "nms-inside" -> three outputs boxes
    [1, N, 4] xyxy, scores [1, N], classes [1, N] int64."""
    h, w = hw
    gh, gw = h // stride, w // stride
    n = gh * gw
    wc = np.full((classes, 3, 1, 1), -10.0, np.float32)
    for c in range(classes):
        wc[c, c % 3] = 20.0
    ys, xs = np.mgrid[0:gh, 0:gw]
    cxcy = np.stack([xs.ravel() * stride + stride / 2, ys.ravel() * stride + stride / 2])
    inits = [numpy_helper.from_array(wc, "wc"),
             numpy_helper.from_array(np.full(classes, -8.0, np.float32), "bc"),
             numpy_helper.from_array(np.array([1, classes, n], np.int64), "shape_c"),
             numpy_helper.from_array(cxcy[None].astype(np.float32), "cxcy")]
    if fmt != "nms-inside":
        inits.append(numpy_helper.from_array(np.full((1, 2, n), stride, np.float32), "wh"))
    nodes = [
        helper.make_node("AveragePool", ["x"], ["pool"], kernel_shape=[stride, stride],
                         strides=[stride, stride]),
        helper.make_node("Conv", ["pool", "wc", "bc"], ["logit"]),
        helper.make_node("Reshape", ["logit", "shape_c"], ["logit_n"]),
        helper.make_node("Sigmoid", ["logit_n"], ["cls"]),  # [1, C, N]
    ]
    outputs = []
    if fmt == "yolov8":
        nodes.append(helper.make_node("Concat", ["cxcy", "wh", "cls"], ["y"], axis=1))
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 + classes, n])]
    elif fmt == "yolov5":
        inits.append(numpy_helper.from_array(np.ones((1, 1, n), np.float32), "obj"))
        nodes += [helper.make_node("Concat", ["cxcy", "wh", "obj", "cls"], ["cf"], axis=1),
                  helper.make_node("Transpose", ["cf"], ["y"], perm=[0, 2, 1])]
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n, 5 + classes])]
    else:  # nms-inside: final boxes, scores and classes as separate outputs
        half = np.full((1, 2, n), stride / 2, np.float32)
        inits.append(numpy_helper.from_array(half, "half"))
        nodes += [helper.make_node("Sub", ["cxcy", "half"], ["p0"]),
                  helper.make_node("Add", ["cxcy", "half"], ["p1"]),
                  helper.make_node("Concat", ["p0", "p1"], ["b4"], axis=1),
                  helper.make_node("Transpose", ["b4"], ["boxes"], perm=[0, 2, 1]),
                  helper.make_node("ReduceMax", ["cls"], ["scores"], axes=[1], keepdims=0)
                  if opset < 18 else helper.make_node("ReduceMax", ["cls", "ax1"], ["scores"],
                                                      keepdims=0),
                  helper.make_node("ArgMax", ["cls"], ["classes"], axis=1, keepdims=0)]
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
        outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, n, 4]),
                   helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, n]),
                   helper.make_tensor_value_info("classes", TensorProto.INT64, [1, n])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])
    graph = helper.make_graph(nodes, f"tiny_{fmt}", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="edgerun-tests")
    model.ir_version = 8
    save(model, str(path))
    return path


def blob_frame(hw: tuple[int, int], cells: list[tuple[int, int, int]], stride: int = 16,
               background: int = 90) -> np.ndarray:
    """A grey BGR frame with pure-colour stride x stride squares: (row, col, class) each,
    class 0 red, 1 green, 2 blue (what `tiny_detector` finds)."""
    f = np.full((*hw, 3), background, np.uint8)
    for r, c, k in cells:
        f[r * stride:(r + 1) * stride, c * stride:(c + 1) * stride] = 0
        f[r * stride:(r + 1) * stride, c * stride:(c + 1) * stride, 2 - k] = 255  # BGR
    return f
