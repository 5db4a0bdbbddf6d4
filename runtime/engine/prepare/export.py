"""Step 1, normalise: the clean fp32 graph every later step starts from (inputs fixed,
opset converted, constants folded), a detector's NMS-inside outputs merged into one.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

from runtime.engine.onnx_model import load_onnx, model_input
from runtime.engine.prepare.errors import StepError


def set_input_shape(proto: onnx.ModelProto, name: str, shape: tuple[int, ...]
                     ) -> onnx.ModelProto:
    """`proto` with input `name` fixed at `shape` (every dimension, dynamic ones too)."""
    for vi in proto.graph.input:
        if vi.name == name:
            for dim, size in zip(vi.type.tensor_type.shape.dim, shape, strict=True):
                dim.Clear()
                dim.dim_value = size
    return proto


def normalise(src: Path, dst: Path, input_shape: tuple[int, ...], staged: Path
              ) -> tuple[str, tuple[int, ...], list[str]]:
    """Step 1; returns (input name, fixed shape, warnings). `dst` gets the constant-folded
    graph (what runs); `staged` the same graph before ORT's folding: ORT's quantizer makes
    invalid graphs from some of ORT's own fusions (seen: ConvAddFusion on PaddlePaddle exports),
    so int8 starts from `staged`."""
    warnings: list[str] = []
    proto = load_onnx(src)
    init_names = {i.name for i in proto.graph.initializer}
    stale = [i for i in proto.graph.input if i.name in init_names]
    if stale:
        for i in stale:
            proto.graph.input.remove(i)
        warnings.append(f"removed {len(stale)} initializer(s) listed as graph inputs")
    inp = model_input(proto, src, input_shape)
    proto = set_input_shape(proto, inp.name, inp.shape)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11:
        try:
            proto = onnx.version_converter.convert_version(proto, 13)
            warnings.append(f"converted opset {opset} -> 13")
        except Exception as e:
            raise StepError("normalise", f"opset {opset} is too old for quantization and "
                            f"converting it to 13 failed: {e}") from e
    try:
        onnx.checker.check_model(proto)
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception as e:
        warnings.append(f"ONNX checker/shape inference complained ({e}); continuing")
    onnx.save(proto, str(staged))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    try:
        ort.InferenceSession(str(staged), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise StepError("normalise", f"ONNX Runtime cannot load the model: {e}") from e
    return inp.name, inp.shape, warnings


def merge_nms_outputs(src: Path, dst: Path) -> list[str]:
    """A model with NMS inside and separate outputs (boxes [1,K,4], scores [1,K], classes
    [1,K], perhaps a detection count) rewritten with one output `detections` [1, K, 6]: x1, y1,
    x2, y2, score, class (what the engines hand edgerun: one output). Outputs are told apart
    by name (box, score, class/label), else taken in that order. Returns the outputs used."""
    from onnx import TensorProto, helper

    proto = load_onnx(src)
    outs = list(proto.graph.output)
    dims = {o.name: len(o.type.tensor_type.shape.dim) for o in outs}

    def pick(words: tuple[str, ...], rank: int, taken: set[str]) -> str | None:
        for o in outs:
            if o.name not in taken and any(w in o.name.lower() for w in words):
                return o.name
        for o in outs:
            if o.name not in taken and dims[o.name] == rank:
                return o.name
        return None

    taken: set[str] = set()
    names = []
    for words, rank in ((("box",), 3), (("score", "conf"), 2), (("class", "label"), 2)):
        n = pick(words, rank, taken)
        if n is None:
            raise StepError("normalise", f"NMS-inside outputs: cannot tell boxes, scores and "
                            f"classes apart among {[o.name for o in outs]}")
        taken.add(n)
        names.append(n)
    boxes, scores, classes = names
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes = [helper.make_node("Cast", [boxes], ["_er_b"], to=TensorProto.FLOAT),
             helper.make_node("Cast", [scores], ["_er_s"], to=TensorProto.FLOAT),
             helper.make_node("Cast", [classes], ["_er_c"], to=TensorProto.FLOAT)]
    if opset >= 13:
        proto.graph.initializer.append(helper.make_tensor("_er_axes", TensorProto.INT64, [1],
                                                          [-1]))
        nodes += [helper.make_node("Unsqueeze", ["_er_s", "_er_axes"], ["_er_s3"]),
                  helper.make_node("Unsqueeze", ["_er_c", "_er_axes"], ["_er_c3"])]
    else:
        nodes += [helper.make_node("Unsqueeze", ["_er_s"], ["_er_s3"], axes=[-1]),
                  helper.make_node("Unsqueeze", ["_er_c"], ["_er_c3"], axes=[-1])]
    nodes.append(helper.make_node("Concat", ["_er_b", "_er_s3", "_er_c3"], ["detections"],
                                  axis=-1))
    proto.graph.node.extend(nodes)
    while proto.graph.output:
        proto.graph.output.pop()
    box_dims = next(o for o in outs if o.name == boxes).type.tensor_type.shape.dim
    lead = [d.dim_value if d.HasField("dim_value") else (d.dim_param or f"d{i}")
            for i, d in enumerate(list(box_dims)[:2])] or ["batch", "k"]
    proto.graph.output.append(helper.make_tensor_value_info("detections", TensorProto.FLOAT,
                                                            [*lead, 6]))
    onnx.save(proto, str(dst))
    return names


def dynamic_hw(proto: onnx.ModelProto) -> bool:
    """Whether the model's image input has a dynamic dimension after the batch one."""
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    return bool(inputs) and any(not (d.HasField("dim_value") and d.dim_value > 0) for d in
                                list(inputs[0].type.tensor_type.shape.dim)[1:])
