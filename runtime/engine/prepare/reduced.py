"""Step 4: the reduced-resolution forms (their sizes, and the graph refolded at each).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from runtime.engine.manifest import Preprocess
from runtime.engine.prepare.errors import Skipped, StepError
from runtime.engine.prepare.export import set_input_shape
from runtime.engine.prepare.session import cpu_session


def reduced_hw(hw: tuple[int, int], multiple: int = 8) -> tuple[int, int]:
    """The reduced form's input (H, W): 2/3 of each side, rounded to `multiple` (at least
    `multiple`, and at least 16), never more than the side itself (a side already that small
    stays as it is: a "reduced" form must not grow a side)."""
    return tuple(min(d, max(16, multiple, round(d * 2 / 3 / multiple) * multiple))  # type: ignore
                 for d in hw)


DETECTOR_SCALES = (0.8, 0.7, 0.5)  # a detector's reduced rungs: 320 -> 256, 224, 160


def detector_sizes(hw: tuple[int, int], multiple: int) -> list[tuple[int, int]]:
    """A detector's reduced input sizes, largest first: each side at DETECTOR_SCALES of its
    own, rounded to `multiple` (its stride), smaller than the input on both sides and at
    least 2 x `multiple` (and 16): 320 at stride 32 -> 256, 224, 160."""
    out: list[tuple[int, int]] = []
    for f in DETECTOR_SCALES:
        size = tuple(max(16, 2 * multiple, round(d * f / multiple) * multiple) for d in hw)
        if all(n < d for n, d in zip(size, hw, strict=True)) and size not in out:
            out.append(size)  # type: ignore[arg-type]
    return out


def given_sizes(hw: tuple[int, int], sizes: tuple[int, ...], multiple: int = 8
                ) -> list[tuple[int, int]]:
    """`--sizes`' input sizes (H, W), largest first: each asked height with the width that
    keeps the aspect ratio (rounded to `multiple`). Raises StepError ("options") for a size
    that is not smaller than the input or below 16: a reduced form must be reduced."""
    h, w = hw
    out: list[tuple[int, int]] = []
    for n in sorted(set(sizes), reverse=True):
        if not 16 <= n < h:
            raise StepError("options", f"--sizes {n}: a reduced input must be at least 16 and "
                            f"smaller than the model's {h}x{w}")
        nw = n if w == h else max(16, round(w * n / h / multiple) * multiple)
        out.append((n, min(nw, w)))
    return out


def _ort_failure(e: BaseException, proto: onnx.ModelProto) -> str:
    """ONNX Runtime's error as one line naming the node that failed (by name, or by its
    output when the exporter left it unnamed), without ORT's source path and assertion."""
    text = " ".join(str(e).split())
    m = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", text) or \
        re.search(r"Node \(([^)]*)\) Op \((\w+)\) (.*)", text)
    if not m:
        return text[:300]
    op, name, why = (m[1], m[2], m[3]) if m.re.pattern.startswith("running") else (
        m[2], m[1], m[3])
    why = re.sub(r"^/\S+:\d+ .*? was false\.\s*", "", why)  # ORT's source line and assertion
    if not name:
        same = [n for n in proto.graph.node if n.op_type == op and not n.name]
        name = (f"(unnamed, output '{same[0].output[0]}')" if len(same) == 1 else
                f"(one of {len(same)} unnamed)")
    else:
        name = f"'{name}'"
    return f"{op} node {name}: {why}"[:300]


def make_reduced(src: Path, dst: Path, input_name: str, shape: tuple[int, ...],
                 pre: Preprocess, form: Callable[[tuple, tuple], str | None] | None = None,
                 multiple: int = 8, size: tuple[int, int] | None = None) -> tuple[int, ...]:
    """Step 4; returns the reduced input shape, or raises Skipped when the graph does not run
    at it or its output changes form. `src` is the normalised graph *before* ORT's constant
    folding (folding at the full size would bake Shape-derived reshapes into constants); it
    is folded here at the reduced size. `form(full, reduced)` (a detector's) says why two
    output shapes are not the same form (None: they are: the candidate count may change);
    without it the output shape must not change (a classifier's)."""
    h, w = pre.hw(shape)
    nh, nw = size or reduced_hw((h, w), multiple)
    if nh >= h and nw >= w:
        raise Skipped("reduced", f"skipped: the input {h}x{w} is already the smallest size "
                      "a reduced form is made at")
    new = (shape[0], shape[1], nh, nw) if pre.layout == "NCHW" else (shape[0], nh, nw, shape[3])
    proto = onnx.load(str(src))
    for vi in list(proto.graph.value_info):
        proto.graph.value_info.remove(vi)  # shapes inferred at full size no longer hold
    proto = set_input_shape(proto, input_name, new)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "reduced.onnx"
        onnx.save(proto, str(staged))
        try:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.optimized_model_filepath = str(dst)
            so.log_severity_level = 4  # the failure is reported below, as one line
            ort.InferenceSession(str(staged), so, providers=["CPUExecutionProvider"])
            full = cpu_session(src).run(None, {input_name: np.zeros(shape, np.float32)})[0]
            out = cpu_session(dst, quiet=True).run(None, {input_name: np.zeros(new, np.float32)})[0]
        except Exception as e:
            dst.unlink(missing_ok=True)
            raise Skipped("reduced", f"skipped: the graph does not run at {nh}x{nw}: "
                          f"{_ort_failure(e, proto)} (sizes fixed in the graph: export it with "
                          "dynamic height and width for a reduced-resolution form)") from e
    why = form(tuple(full.shape), tuple(out.shape)) if form is not None else (
        None if out.shape == full.shape else
        f"output shape changes with resolution ({full.shape} -> {out.shape})")
    if why:
        dst.unlink(missing_ok=True)
        raise Skipped("reduced", f"skipped: at {nh}x{nw} {why}")
    if out.shape != full.shape:  # declare what it gives: engines may trust the declared shape
        done = onnx.load(str(dst))
        dims = done.graph.output[0].type.tensor_type.shape
        dims.ClearField("dim")
        for d in out.shape:
            dims.dim.add().dim_value = int(d)
        onnx.save(done, str(dst))
    return new
