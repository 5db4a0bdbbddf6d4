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
