"""A small real detector in Ultralytics' export format, built with onnx.helper.

The graph is tests/support/modelgen.py's colour-blob detector (YOLOv8 output [1, 4+C, N], one
candidate per 16x16 cell) with one change that makes it care about normalisation the way a
trained YOLO does: a cell whose pooled pixel values leave 0..1 (beyond 1.05, as ImageNet
mean/std makes bright pixels) has its class scores pushed down to nothing. So with RGB
pixels / 255 (what Ultralytics' metadata implies) it finds the blobs of `blob_frame`, with
ImageNet normalisation it finds no box at all: the blind ladder of issue 24, in miniature.
The metadata is what Ultralytics writes: names (a dict literal), imgsz, stride, task, author.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from support.modelgen import tiny_detector


def ultralytics_detector(path: Path, names: dict | str | None = None,
                         imgsz: str | None = "[64, 64]", stride: str | None = "16",
                         task: str | None = "detect", dynamic: bool = True,
                         classes: int = 3) -> Path:
    """Write the detector to `path`; each metadata value is the raw string written (None:
    the key is left out). `dynamic`: the input's height and width are symbolic (as
    Ultralytics' dynamic=True export; the graph still runs only at 64x64)."""
    tiny_detector(path, "yolov8", hw=(64, 64), stride=16, classes=classes)
    m = onnx.load(str(path))
    g = m.graph
    conv = next(n for n in g.node if n.op_type == "Conv")
    conv.output[0] = "logit_raw"
    g.initializer.extend([numpy_helper.from_array(np.array(1.05, np.float32), "sat_at"),
                          numpy_helper.from_array(np.array(100.0, np.float32), "sat_k"),
                          numpy_helper.from_array(np.array([1], np.int64), "ax_c")])
    gate = [helper.make_node("Sub", ["pool", "sat_at"], ["over"]),
            helper.make_node("Relu", ["over"], ["sat"]),
            helper.make_node("ReduceSum", ["sat", "ax_c"], ["sat_sum"], keepdims=1),
            helper.make_node("Mul", ["sat_sum", "sat_k"], ["pen"]),
            helper.make_node("Sub", ["logit_raw", "pen"], ["logit"])]
    at = list(g.node).index(conv) + 1
    nodes = list(g.node)
    nodes[at:at] = gate
    del g.node[:]
    g.node.extend(nodes)
    if dynamic:
        dims = g.input[0].type.tensor_type.shape.dim
        for i, name in ((0, "batch"), (2, "height"), (3, "width")):
            dims[i].Clear()
            dims[i].dim_param = name
    meta = {"author": "Ultralytics", "task": task, "stride": stride, "imgsz": imgsz,
            "batch": "1",
            "names": names if isinstance(names, str) else repr(
                names if names is not None else {i: f"obj{i}" for i in range(classes)})}
    for k, v in meta.items():
        if v is not None:
            p = m.metadata_props.add()
            p.key, p.value = k, v
    onnx.save(m, str(path))
    return path
