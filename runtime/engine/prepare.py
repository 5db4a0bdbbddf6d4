"""`edgerun models prepare`: turn an fp32 ONNX model into measured precision variants.

Steps, each reported by name when it fails:
1. normalise  — drop initializers listed as inputs, fix dynamic dims (batch -> 1, the rest from
                --input-shape), convert opsets older than 11 to 13, check, fold constants with
                ORT's basic level (standard ONNX ops only), so every later step starts clean;
2. fp16       — weights and math in fp16, inputs/outputs kept fp32 (ORT's converter);
3. int8       — static QDQ, per-channel weights, calibrated on --calib images; ORT's
                pre-processing (symbolic shape inference) is tried and skipped with a warning
                when it fails, as it does on many third-party graphs;
4. reduced    — the fp32 graph at 2/3 input resolution (folded at that size), when the graph
                runs at it (fully convolutional, reshapes from Shape ops or -1) and its output
                keeps its form: the same shape for a classifier; for a detector the same
                per-candidate rows, the candidate count may change. A graph that does not
                run at it (fixed reshape or anchor constants) is skipped, the failing node
                named;
5. measure    — every variant on the --val images against the fp32 outputs: top-1 agreement,
                max/mean absolute output difference, and accuracy against labels when given;
6. floor      — a variant whose accuracy is below --min-accuracy-ratio (default 0.5) x its
                fp32 form's is not written as a rung (listed as skipped, with both figures).
A failed variant is reported and skipped; the others are still written with the manifest.

Detectors (docs/detectors.md): the task and output form are declared (--task detect --format)
or read from the output's shape; variants are measured by mAP@0.5 against YOLO label files
beside the val images (`DIR/labels/x.txt` for `DIR/images/x.png`, or `x.txt` next to it), or,
without label files, by the mAP of each variant's detections against fp32's ("agreement";
fp32's at full resolution, for the reduced form too); boxes are normalised by each variant's
own input size. The manifest gets a `postprocess` section. A model with separate
boxes/scores/classes outputs (NMS inside) is merged to one `[1, K, 6]` output first.

Images are optional (docs/manifest.md "Without labelled images"): with only --val, int8 is
calibrated on the val images and accuracy is top-1 agreement with fp32; with no images at all,
only fp16 is made, measured on generated inputs (`accuracy_basis` "agreement-generated"), and
int8 and reduced are listed in `failed` as skipped, with the reason. A failure before any
variant exists (reading images, normalise, the fp32 reference) raises StepError naming the
step; the CLI prints it as one error line naming the model.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort

from runtime.engine import detection, model_meta, sanity
from runtime.engine.manifest import (
    MANIFEST,
    SCHEMA,
    Preprocess,
    VariantEntry,
    _detector_classes,
    _layout,
    _output_dims,
    load_manifest,
    model_task,
)
from runtime.engine.onnx_model import ModelError, file_sha256, load_onnx, model_input

log = logging.getLogger("edgerun.ladder")

# A form measured below this fraction of its fp32 form's accuracy is not written as a rung:
# its results are mostly wrong (seen: int8 of the random-weight bench detector at mAP 0.056 of
# fp32's 1.0). The good rungs of the bundled models keep 0.87 (defects int8) and more of
# fp32's; the weakest kept form measured anywhere here, PP-OCR's 32-px text-direction form,
# keeps 0.525 (models/README.md), so 0.5 drops only what is close to useless.
MIN_ACCURACY_RATIO = 0.5

IMAGE_EXT = {".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"}


class StepError(ModelError):
    """One preparation step failed; `step` names it."""

    def __init__(self, step: str, message: str):
        super().__init__(f"{step}: {message}")
        self.step, self.message = step, message


def _as_step(step: str, e: BaseException) -> StepError:
    """`e` as a StepError of `step` (kept as is when it already names its step), with the
    first line of its message: an operator reads one line, not a traceback."""
    if isinstance(e, StepError):
        return e
    first = str(e).splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return StepError(step, first)


@dataclass(frozen=True)
class PrepareOptions:
    """What `models prepare` was asked for."""

    name: str
    preprocess: Preprocess | None = None  # None: the model's metadata, else the one default
    labels: tuple[str, ...] = ()  # (): the model's metadata names, else none
    preprocess_source: str = "given"  # where `preprocess` came from, for the operator
    labels_source: str = "given"  # where `labels` came from (a labels file's path)
    check_reference: bool = True  # refuse a blind fp32 reference (runtime/engine/sanity.py)
    input_shape: tuple[int, ...] = ()
    prefix: str = ""  # non-empty: add this model's variants to an existing manifest
    output: str = "probabilities"
    max_calib: int = 200
    max_val: int = 2000
    reduced: bool = True
    # reduced-resolution forms at these input heights (largest first; the width keeps the
    # aspect ratio); (): a detector's DETECTOR_SCALES, a classifier's one form at 2/3
    sizes: tuple[int, ...] = ()
    generated: int = 64  # inputs generated to measure on when there are no images
    task: str = "auto"  # auto | classify | detect (auto: from the output's shape)
    format: str = "auto"  # a detector's output form: auto | yolov8 | yolov5 | nms-inside
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    min_accuracy_ratio: float = MIN_ACCURACY_RATIO  # a form below this x fp32's is no rung


def below_floor(accuracy: float, reference: float, ratio: float) -> float | None:
    """The accuracy floor a variant missed (`ratio` x its fp32 form's `reference` accuracy),
    or None when it is at or above it. A ratio of 0 keeps everything."""
    floor = ratio * reference
    return floor if accuracy < floor else None


def list_images(root: Path, limit: int) -> list[Path]:
    """Image files under `root` (recursively, sorted), at most `limit`, evenly spread."""
    if not root.is_dir():
        raise ModelError(f"{root}: not a directory of images")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXT)
    if not files:
        raise ModelError(f"{root}: no images ({', '.join(sorted(IMAGE_EXT))})")
    if len(files) > limit:
        files = [files[i] for i in np.linspace(0, len(files) - 1, limit).astype(int)]
    return files


def read_image(path: Path) -> np.ndarray:
    """BGR uint8; ModelError naming the file when it cannot be decoded."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise ModelError(f"{path}: not a readable image")
    return img


def _session(path: Path, quiet: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4 if quiet else 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _set_input_shape(proto: onnx.ModelProto, name: str, shape: tuple[int, ...]
                     ) -> onnx.ModelProto:
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
    proto = _set_input_shape(proto, inp.name, inp.shape)
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


def make_fp16(src: Path, dst: Path) -> None:
    """Step 2."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))


def _reader(batches: Callable[[], Iterator[np.ndarray]], input_name: str) -> Any:
    """ORT's calibration feed over `batches()` (one pass), as its quantizer asks for it."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = batches()

        def get_next(self):
            x = next(self._it, None)
            return None if x is None else {input_name: x}

    return Reader()


def make_int8(src: Path, dst: Path, batches: Callable[[], Iterator[np.ndarray]],
              input_name: str) -> list[str]:
    """Step 3; returns warnings. ORT's pre-processing optimises the graph first; some of its
    fusions quantize into invalid graphs (a DequantizeLinear over an int32 fused bias, seen on
    a PaddlePaddle export), so an int8 model that does not load is rebuilt without them."""
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    warnings: list[str] = []
    import importlib.util

    # symbolic shape inference imports sympy (a dependency of edgerun): when an
    # install lacks it, that pass is skipped on purpose, said once, not tried and warned about
    symbolic = importlib.util.find_spec("sympy") is not None
    if not symbolic:
        warnings.append("int8: sympy is not installed, so ORT's symbolic shape inference is "
                        "skipped (pip install sympy; it is in edgerun's dependencies)")
    with tempfile.TemporaryDirectory() as tmp:
        for skip_opt in (False, True):
            pre = Path(tmp) / f"pre{int(skip_opt)}.onnx"
            try:
                quant_pre_process(str(src), str(pre), skip_optimization=skip_opt,
                                  skip_symbolic_shape=not symbolic)
            except Exception as e:
                warnings.append(f"int8: symbolic shape inference failed ({type(e).__name__}: "
                                f"{e}); skipped it")
                try:
                    quant_pre_process(str(src), str(pre), skip_optimization=skip_opt,
                                      skip_symbolic_shape=True)
                except Exception:
                    shutil.copy(src, pre)
            quantize_static(str(pre), str(dst), _reader(batches, input_name),
                            quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            try:
                _session(dst)
                return warnings
            except Exception as e:
                why = str(e).splitlines()[0][:200]
                if skip_opt:
                    raise StepError("int8", f"the quantized graph does not load: {why}") from e
                warnings.append(f"int8: quantizing the ORT-optimised graph gave an invalid model "
                                f"({why}); rebuilt without pre-quantization optimisation")
    return warnings


def int8_base(src: Path, dst: Path) -> list[str]:
    """ORT's pre-quantization processing of `src` into `dst`, every node named (the int8
    search excludes nodes by name); returns warnings."""
    import importlib.util

    from onnxruntime.quantization import quant_pre_process

    from runtime.engine.int8_search import name_nodes

    warnings: list[str] = []
    symbolic = importlib.util.find_spec("sympy") is not None
    if not symbolic:
        warnings.append("int8: sympy is not installed, so ORT's symbolic shape inference is "
                        "skipped (pip install sympy; it is in edgerun's dependencies)")
    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=not symbolic)
    except Exception as e:
        warnings.append(f"int8: ORT's pre-processing failed ({type(e).__name__}: {e}); "
                        "quantizing the graph as it is")
        shutil.copy(src, dst)
    proto = onnx.load(str(dst))
    if name_nodes(proto):
        onnx.save(proto, str(dst))
    return warnings


def quantize_to(pre: Path, dst: Path, batches: Callable[[], Iterator[np.ndarray]],
                input_name: str, exclude: list[str], method: str) -> None:
    """Static QDQ int8 of `pre` (from int8_base) into `dst`: per-channel weights, `exclude`d
    nodes left in float, calibrated by `method` (MinMax | Percentile | Entropy); raises
    StepError when the result does not load."""
    import contextlib
    import io

    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    with contextlib.redirect_stdout(io.StringIO()):  # the calibrators print their progress
        quantize_static(str(pre), str(dst), _reader(batches, input_name),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=list(exclude),
                        calibrate_method=getattr(CalibrationMethod, method))
    try:
        _session(dst)
    except Exception as e:
        raise StepError("int8", f"the quantized graph does not load: "
                        f"{str(e).splitlines()[0][:200]}") from e


class Skipped(StepError):
    """A step this model cannot take (not an error of the model): listed in the manifest's
    `failed` with `"skipped": true` and the reason."""


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
    proto = _set_input_shape(proto, input_name, new)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "reduced.onnx"
        onnx.save(proto, str(staged))
        try:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.optimized_model_filepath = str(dst)
            so.log_severity_level = 4  # the failure is reported below, as one line
            ort.InferenceSession(str(staged), so, providers=["CPUExecutionProvider"])
            full = _session(src).run(None, {input_name: np.zeros(shape, np.float32)})[0]
            out = _session(dst, quiet=True).run(None, {input_name: np.zeros(new, np.float32)})[0]
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


def measure(path: Path, input_name: str, tensors: list[np.ndarray], ref: np.ndarray,
            truth: np.ndarray | None) -> dict[str, float]:
    """Step 5 for one variant: outputs on every val tensor vs the fp32 reference."""
    sess = _session(path)
    out = np.concatenate([sess.run(None, {input_name: t})[0].reshape(1, -1) for t in tensors])
    diff = np.abs(out.astype(np.float64) - ref)
    agreement = float((out.argmax(1) == ref.argmax(1)).mean())
    acc = float((out.argmax(1) == truth).mean()) if truth is not None else agreement
    return {"accuracy": acc, "agreement": agreement, "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean())}


def measure_detector(path: Path, input_name: str, tensors: list[np.ndarray],
                     ref: np.ndarray, ref_dets: list[detection.Detections],
                     truth: list[tuple[np.ndarray, np.ndarray]] | None,
                     spec: detection.DetectSpec, hw: tuple[int, int], classes: int | None,
                     other_resolution: bool = False) -> dict[str, float]:
    """Step 5 for one detector variant: mAP@0.5 against the labels (accuracy) and against
    fp32's detections (agreement), and the raw output difference from fp32 (None for a form
    at another resolution: its candidates are other ones). Boxes are normalised by this
    variant's own input `hw`. Candidates are ranked down to a score of 0.001 (the usual mAP
    protocol), not cut at the serving threshold."""
    sess = _session(path)
    outs = [sess.run(None, {input_name: t})[0] for t in tensors]
    flat = np.concatenate([o.reshape(1, -1) for o in outs]).astype(np.float64)
    dets = [detection.detect(o, spec, hw, classes, score_threshold=0.001) for o in outs]
    agreement = detection.mean_ap(dets, [(d.boxes, d.classes) for d in ref_dets])
    acc = detection.mean_ap(dets, truth) if truth is not None else agreement
    # another resolution: other candidates, or (a fixed count: NMS inside) boxes in other
    # pixels; nothing to subtract
    if other_resolution or flat.shape != ref.shape:
        return {"accuracy": acc, "agreement": agreement, "max_abs_diff": None,
                "mean_abs_diff": None}
    diff = np.abs(flat - ref)
    return {"accuracy": acc, "agreement": agreement, "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean())}


def label_file(image: Path) -> Path:
    """Where an image's YOLO label file is: `.../labels/x.txt` for `.../images/x.png` (the
    usual dataset layout), else `x.txt` beside the image."""
    parts = list(image.parts)
    if "images" in parts[:-1]:
        i = len(parts) - 1 - parts[:-1][::-1].index("images") - 1
        parts[i] = "labels"
        return Path(*parts).with_suffix(".txt")
    return image.with_suffix(".txt")


def detector_truth(files: list[Path], classes: int | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Each val image's boxes from its YOLO label file; None when no image has one
    (unlabelled: agreement with fp32). An image without a file, when others have one, has no
    objects (the YOLO convention). A malformed file raises ModelError naming it."""
    paths = [label_file(f) for f in files]
    if not any(p.exists() for p in paths):
        if files:
            log.info("no YOLO label file beside the val images (e.g. %s): the images are taken "
                     "as unlabelled and accuracy is mAP against fp32's detections", paths[0])
        return None
    out = []
    for p in paths:
        if not p.exists():
            out.append((np.zeros((0, 4), np.float32), np.zeros(0, np.int64)))
            continue
        try:
            out.append(detection.read_yolo_labels(p, classes))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ModelError(str(e)) from e
    return out


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


def generated_frames(hw: tuple[int, int], n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` BGR frames with structure at several scales (random coarse grids upsampled, with
    random contrast and some pixel noise): a model's top class moves with them, unlike on
    flat noise, so fp16's agreement with fp32 on them says something. Still no substitute for
    real images: the manifest's accuracy basis says "agreement-generated"."""
    rng = np.random.default_rng(seed)
    h, w = hw
    out = []
    for i in range(n):
        cells = int(rng.integers(2, 17))
        coarse = rng.integers(0, 256, (cells, cells, 3)).astype(np.float32)
        f = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_LINEAR if i % 2 else
                       cv2.INTER_CUBIC)
        lo, hi = sorted(rng.uniform(0, 1, 2))
        f = f * (hi - lo + 0.1) + lo * 128 + rng.normal(0, 8, f.shape)
        out.append(np.clip(f, 0, 255).astype(np.uint8))
    return out


def _truth(files: list[Path], labels: tuple[str, ...]) -> np.ndarray | None:
    """Ground-truth indices from each image's parent folder name (None without labels, or when
    no image sits in a folder named for a label: unlabelled images, agreement only)."""
    if not labels or not files:
        return None
    index = {name: i for i, name in enumerate(labels)}
    if not any(f.parent.name in index for f in files):
        log.info("no val image is in a folder named for a label: the images are taken as "
                 "unlabelled and accuracy is top-1 agreement with fp32")
        return None
    missing = sorted({f.parent.name for f in files if f.parent.name not in index})
    if missing:
        raise ModelError(f"val images in folders that are not labels: {missing[:5]} "
                         f"(labels: {list(labels)}); put each image under a folder named for "
                         "its label")
    return np.array([index[f.parent.name] for f in files])


def _labels_against(labels: tuple[str, ...], where: str, classes: int | None,
                    model: Path) -> None:
    """StepError naming the labels' source when their count is not the output's classes."""
    if labels and classes is not None and len(labels) != classes:
        more = "too many" if len(labels) > classes else "too few"
        raise StepError("options", f"{where}: {len(labels)} labels ({more}) but the output of "
                        f"{model} scores {classes} classes: one label per line, in output order")


def _dynamic_hw(proto: onnx.ModelProto) -> bool:
    """Whether the model's image input has a dynamic dimension after the batch one."""
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    return bool(inputs) and any(not (d.HasField("dim_value") and d.dim_value > 0) for d in
                                list(inputs[0].type.tensor_type.shape.dim)[1:])


EVAL_IMAGES = 64  # val images kept in the ladder for engines to measure their own precisions


def _eval_set(images: list[np.ndarray], hw: tuple[int, int], pre: Preprocess,
              truth: np.ndarray | None, det_truth: list | None, path: Path) -> int:
    """Write up to EVAL_IMAGES val images (JPEG, at the fp32 input size, evenly spread)
    and their labels into `path` (npz): what runtime/choice/hint_accuracy.py measures an
    engine's own precision (OpenVINO bf16, OpenCV fp16) on. Returns how many."""
    from runtime.engine.manifest import _RESIZE

    idx = np.linspace(0, len(images) - 1, min(EVAL_IMAGES, len(images))).astype(int)
    h, w = hw
    # JPEG (quality 95): 64 frames of 320 px as raw pixels were 16 MB in a ladder that ships
    # over the air; lossy is fine here, as the engine and its reference both see the decoded
    # image (runtime/choice/hint_accuracy.py compares them on the same pixels)
    jpegs = []
    for i in idx:
        img = cv2.resize(images[i], (w, h), interpolation=_RESIZE[pre.resize]) \
            if images[i].shape[:2] != (h, w) else images[i]
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise StepError("eval", f"cannot encode val image {int(i)} as JPEG")
        jpegs.append(buf.reshape(-1))
    arrays: dict[str, np.ndarray] = {
        "jpeg": np.concatenate(jpegs).astype(np.uint8),
        "jpeg_offsets": np.cumsum([0, *(len(b) for b in jpegs)]).astype(np.int64)}
    if truth is not None:
        arrays["truth"] = truth[idx].astype(np.int64)
    if det_truth is not None:
        chosen = [det_truth[i] for i in idx]
        arrays["boxes"] = np.concatenate([b for b, _ in chosen] or [np.zeros((0, 4))]
                                         ).astype(np.float32).reshape(-1, 4)
        arrays["classes"] = np.concatenate([c for _, c in chosen] or [np.zeros(0)]
                                           ).astype(np.int64)
        arrays["offsets"] = np.cumsum([0, *(len(c) for _, c in chosen)]).astype(np.int64)
    with path.open("wb") as f:
        np.savez_compressed(f, **arrays)
    return len(idx)


def _judge_reference(raw: list[np.ndarray], ref: np.ndarray, ref_dets: list | None,
                     generated: bool) -> sanity.Verdict:
    """The fp32 reference's verdict (runtime/engine/sanity.py): on generated inputs only
    NaN and constant outputs count (no class share or box rate means anything on them)."""
    if generated:
        return sanity.judge(ref)
    if ref_dets is not None:
        return sanity.judge(ref, boxes=[len(d) for d in ref_dets])
    return sanity.judge(ref, top1=[int(i) for i in ref.argmax(1)])


def prepare(model: Path, calib: Path | None, val: Path | None, out: Path,
            opts: PrepareOptions, progress: Callable[[str], None] = lambda m: None) -> dict:
    """Run every step; write variants and the manifest into `out`; returns the manifest dict.
    `calib` and `val` are optional (module doc). Every file is made in a scratch folder and
    moved into `out` only once the manifest is whole: a failure leaves `out` as it was.
    Raises StepError when no manifest can be made (its step named), ModelError for a bad
    `--prefix` manifest."""
    existing = None
    if opts.prefix and (out / MANIFEST).exists():
        try:
            existing = json.loads((out / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"{out / MANIFEST}: cannot read the manifest to add to: {e}") from e
    stem = f"{opts.prefix}-" if opts.prefix else ""
    try:
        val_files = list_images(val, opts.max_val) if val else []
        if calib:
            calib_files = list_images(calib, opts.max_calib)
        else:  # calibrating on what is measured flatters int8 a little; better than no int8
            calib_files = val_files[::max(1, len(val_files) // opts.max_calib)][:opts.max_calib]
            if calib_files:
                log.warning("%s: no --calib: int8 is calibrated on the --val images it is then "
                            "measured on", model.name)
        val_images = [read_image(f) for f in val_files]
    except Exception as e:
        raise _as_step("images", e) from e
    work = tempfile.TemporaryDirectory(prefix="edgerun-prepare-")
    try:
        stage = Path(work.name) / "out"
        stage.mkdir()
        doc = _prepare(model, calib_files, val_files, val_images, stage, Path(work.name), opts,
                       existing, stem, progress, val, out)
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(stage.iterdir()):  # variants first, the manifest last
            if f.name != MANIFEST:
                shutil.move(str(f), str(out / f.name))
        tmp = out / f".{MANIFEST}.tmp"
        shutil.move(str(stage / MANIFEST), str(tmp))
        tmp.replace(out / MANIFEST)
    finally:
        work.cleanup()
    load_manifest(out)  # what we wrote must load
    return doc


@dataclass
class _Run:
    """What the steps of one `_prepare` share: the model, its options (updated as steps
    settle the format, preprocessing and labels) and what each step found."""

    model: Path
    opts: PrepareOptions
    out: Path  # the scratch folder the variants and the manifest are written into
    scratch: Path
    stem: str
    calib_files: list[Path]
    val_files: list[Path]
    val_images: list[np.ndarray]
    fp32: Path = Path()
    staged: Path = Path()
    meta: Any = None
    input_name: str = ""
    shape: tuple[int, ...] = ()
    shape_from: str = ""
    dynamic_hw: bool = False  # the model's image input has dynamic height/width
    pre: Preprocess = field(default_factory=Preprocess)
    pre_source: str = ""
    labels_source: str = ""
    spec: detection.DetectSpec | None = None
    out_shape: tuple[int, ...] = ()
    n_classes: int | None = None
    truth: np.ndarray | None = None
    det_truth: list | None = None
    generated: bool = False
    full: list[np.ndarray] = field(default_factory=list)
    ref: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ref_dets: list = field(default_factory=list)
    verdict: sanity.Verdict | None = None
    entries: list[VariantEntry] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    search_log: list[dict] = field(default_factory=list)

    @property
    def hw(self) -> tuple[int, int]:
        """The fp32 form's input (H, W)."""
        return self.pre.hw(self.shape)

    @property
    def labelled(self) -> bool:
        """Whether the val images carry labels (folder names, or YOLO label files)."""
        return self.truth is not None or self.det_truth is not None

    def tensors(self, shape: tuple[int, ...]) -> list[np.ndarray]:
        """The val images preprocessed for an input of `shape`."""
        return [self.pre.apply(img, shape) for img in self.val_images]

    def calib_batches(self) -> Iterator[np.ndarray]:
        """The calibration images, one preprocessed tensor each, read as they are used."""
        for f in self.calib_files:
            yield self.pre.apply(read_image(f), self.shape)


def _prepare(model: Path, calib_files: list[Path], val_files: list[Path],
             val_images: list[np.ndarray], out: Path, scratch: Path, opts: PrepareOptions,
             existing: dict | None, stem: str, progress: Callable[[str], None],
             val: Path | None, dest: Path) -> dict:
    """prepare()'s steps, writing into the scratch folder `out` (`dest`: where it goes)."""
    run = _Run(model, opts, out, scratch, stem, calib_files, val_files, val_images,
               fp32=out / f"{stem}fp32.onnx", staged=scratch / "staged.onnx")
    progress("normalise")
    _step_normalise(run)
    _step_preprocess(run, existing, dest)
    progress(f"preprocess {model_meta.describe(run.pre.to_dict())} (from {run.pre_source})")
    _step_task(run)
    _step_reference(run, val)
    _add_variant(run, f"{stem}fp32", "fp32", "fp32", run.fp32, run.shape, run.full, progress)
    _step_variants(run, progress)
    doc = _manifest_doc(run)
    if existing:
        doc = _merge_existing(doc, existing, run, dest)
    (out / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _step_normalise(run: _Run) -> None:
    """Step 1: read the model's metadata and task, merge NMS-inside outputs, fix the input
    shape and write the clean fp32 graph."""
    model = run.model
    try:
        src = model
        proto0 = load_onnx(model)
        run.meta = model_meta.read_meta(proto0, model)
        task = model_meta.task_from_meta(run.meta, model, run.opts.task)
        outputs = _output_dims(proto0)
        if (len(outputs) > 1 and task != "classify"
                and run.opts.format in ("auto", "nms-inside")):
            src = run.scratch / "merged.onnx"
            used = merge_nms_outputs(model, src)
            log.warning("%s: %d outputs taken as a detector with NMS inside (boxes %s, scores "
                        "%s, classes %s): merged into one [1, K, 6] output", model.name,
                        len(outputs), *used)
            run.opts = replace(run.opts, format="nms-inside")
            task = "detect"
        run.opts = replace(run.opts, task=task)
        given_shape, run.shape_from = model_meta.default_input_shape(
            proto0, run.opts.input_shape, run.meta)
        run.input_name, run.shape, warnings = normalise(src, run.fp32, given_shape, run.staged)
        run.dynamic_hw = _dynamic_hw(proto0)
    except Exception as e:
        raise _as_step("normalise", e) from e
    for w in warnings:
        log.warning("%s: %s", model.name, w)
    if run.shape_from.startswith("metadata"):
        log.info("%s: input fixed at %s from its %s", model.name, list(run.shape),
                 run.shape_from)


def _step_preprocess(run: _Run, existing: dict | None, dest: Path) -> None:
    """Preprocessing and labels: given, else the model's metadata, else the one default;
    refused when they differ from the manifest added to."""
    model, opts = run.model, run.opts
    try:
        layout = _layout(run.shape, model)
        if opts.preprocess is None:
            chosen = model_meta.choose_preprocess(None, "", run.meta)
            pre = Preprocess.from_dict({**{k: list(v) if isinstance(v, tuple) else v
                                           for k, v in chosen.value.items()},
                                        "layout": layout}, f"{model}: preprocess")
            run.pre_source = chosen.source
        else:
            pre, run.pre_source = opts.preprocess, opts.preprocess_source
        labels_chosen = model_meta.choose_labels(opts.labels, opts.labels_source, run.meta)
        labels, run.labels_source = labels_chosen.value, labels_chosen.source
    except ModelError as e:
        raise _as_step("options", e) from e
    run.pre = pre
    run.opts = replace(opts, preprocess=pre, labels=labels)
    log.info("%s: preprocessing %s (from %s); labels: %s", model.name,
             model_meta.describe(pre.to_dict()), run.pre_source,
             f"{len(labels)} from {run.labels_source}" if labels else "none")
    if existing and existing["preprocess"] != pre.to_dict():
        raise ModelError(f"{dest / MANIFEST}: preprocessing differs from this model's "
                         f"({existing['preprocess']} vs {pre.to_dict()}); variants in one "
                         "manifest must share it")


def _step_task(run: _Run) -> None:
    """Classifier or detector: declared, or read from the output's real shape; the labels and
    the metadata checked against the output; the val images' labels read."""
    model, opts, labels = run.model, run.opts, run.opts.labels
    try:
        probe = _session(run.fp32)
        out_shape = probe.run(None, {run.input_name: np.zeros(run.shape, np.float32)})[0].shape
        dims = [(probe.get_outputs()[0].name, tuple(out_shape))]
        fmt = model_task(model, dims, opts.task, opts.format, labels)
        run.spec = None if fmt is None else detection.DetectSpec.from_dict(
            {"task": "detect", "format": fmt, "score_threshold": opts.score_threshold,
             "iou_threshold": opts.iou_threshold}, f"{model}: options")
        classes = (int(np.prod(out_shape[1:])) if fmt is None else
                   _detector_classes(fmt, tuple(out_shape), labels))
        if run.labels_source.startswith("metadata"):
            model_meta.check_against(run.meta, model, run.hw, classes, run.dynamic_hw)
        else:
            model_meta.check_against(replace(run.meta, names=None), model, run.hw, classes,
                                     run.dynamic_hw)
            _labels_against(labels, run.labels_source, classes, model)
    except StepError:
        raise
    except Exception as e:
        raise _as_step("task", e) from e
    run.out_shape = tuple(out_shape)
    try:  # labels: folder names for a classifier, YOLO label files for a detector
        run.truth = _truth(run.val_files, labels) if run.spec is None else None
        run.det_truth = detector_truth(run.val_files, len(labels) or None) if (
            run.spec is not None) else None
    except Exception as e:
        raise _as_step("images", e) from e
    if run.spec is not None and run.spec.format != "nms-inside":
        run.n_classes = len(labels) or None
        log.info("%s: a %s detector, output %s; measured by mAP@0.5 %s", model.name,
                 run.spec.format, list(out_shape), "against the label files" if run.det_truth
                 is not None else "against fp32's detections")


def _step_reference(run: _Run, val: Path | None) -> None:
    """The fp32 reference's outputs on the val images (generated inputs without any), and
    its verdict: a blind reference is refused unless the images are labelled or the check
    is off (runtime/engine/sanity.py)."""
    model, pre = run.model, run.pre
    run.generated = not run.val_images
    if run.generated:
        run.val_images = generated_frames(run.hw, run.opts.generated)
        log.warning("%s: no images: only fp16 is made, measured against fp32 on %d generated "
                    "inputs; give --val DIR (unlabelled is fine) for int8 and a measured "
                    "agreement", model.name, len(run.val_images))
    try:
        run.full = run.tensors(run.shape)
        ref_sess = _session(run.fp32)
        raw = [ref_sess.run(None, {run.input_name: t})[0] for t in run.full]
        run.ref = np.concatenate([r.reshape(1, -1) for r in raw]).astype(np.float64)
        run.ref_dets = [] if run.spec is None else [
            detection.detect(r, run.spec, run.hw, run.n_classes) for r in raw]
    except Exception as e:
        raise _as_step("measure", e) from e
    verdict = _judge_reference(raw, run.ref, run.ref_dets if run.spec is not None else None,
                               run.generated)
    run.verdict = verdict
    where = (f"{len(run.val_images)} "
             f"{'generated inputs' if run.generated else f'images in {val}'}")
    if not verdict.blind:
        log.info("%s: fp32 reference on %s: %s", model.name, where, verdict.seen)
        return
    what = (f"the fp32 reference looks blind on {where}: {verdict.seen} (preprocessing "
            f"{model_meta.describe(pre.to_dict())}, from {run.pre_source})")
    if run.labelled and verdict.kind in ("no-boxes", "one-class"):
        log.warning("%s: %s; the images are labelled, so the accuracy below is the real "
                    "one against the labels", model.name, what)
    elif run.opts.check_reference:
        raise StepError("reference", f"{what}: agreement with it would mean nothing. Check "
                        "the preprocessing (--preprocess) and the images; with labels the "
                        "real accuracy is measured instead; --no-reference-check writes "
                        "the ladder anyway")
    else:
        log.warning("%s: %s; written anyway (--no-reference-check)", model.name, what)


def _metric(run: _Run) -> str:
    return "top-1" if run.spec is None else "mAP@0.5"


def _add_variant(run: _Run, name: str, step: str, precision: str, path: Path,
                 shape: tuple[int, ...], inputs: list[np.ndarray],
                 progress: Callable[[str], None]) -> None:
    """Step 5 and 6 for one variant: measure it; keep it as a rung, or list it as skipped
    (and delete its file) when it falls below the accuracy floor."""
    progress(f"measure {name}")
    m = measure(path, run.input_name, inputs, run.ref, run.truth) if run.spec is None else \
        measure_detector(path, run.input_name, inputs, run.ref, run.ref_dets, run.det_truth,
                         run.spec, run.pre.hw(shape), run.n_classes,
                         other_resolution=tuple(shape) != tuple(run.shape))
    diff = "n/a (other resolution)" if m["max_abs_diff"] is None else \
        f"{m['max_abs_diff']:.2e}"
    log.info("%s: accuracy %.4f, agreement %.4f, max |diff| %s", name, m["accuracy"],
             m["agreement"], diff)
    entries, opts = run.entries, run.opts
    floor = None if not entries else below_floor(m["accuracy"], entries[0].accuracy,
                                                 opts.min_accuracy_ratio)
    if floor is not None:  # mostly wrong results: not a rung the governor may step to
        why = (f"skipped: {_metric(run)} {m['accuracy']:.4f} is below the floor {floor:.4f} "
               f"({opts.min_accuracy_ratio:g} x fp32's {entries[0].accuracy:.4f}, "
               "--min-accuracy-ratio): not written as a rung")
        log.warning("%s: variant %s %s", run.model.name, name, why)
        run.failed.append({"variant": name, "step": step, "error": why, "skipped": True,
                           "accuracy": m["accuracy"], "floor": floor})
        path.unlink(missing_ok=True)
        return
    entries.append(VariantEntry(name=name, precision=precision, file=path.name,
                                sha256=file_sha256(path), input_name=run.input_name,
                                input_shape=tuple(shape), size_bytes=path.stat().st_size,
                                source=run.model.name, **m))


def _make_int8(run: _Run, p: Path) -> tuple[tuple[int, ...], list[str]]:
    """Step 3: a classifier's static QDQ int8; a detector's with its box decoding left in
    float as far as measurement says it must be (runtime/engine/int8_search.py)."""
    if run.spec is None:
        return run.shape, make_int8(run.staged, p, run.calib_batches, run.input_name)
    from runtime.engine import int8_search

    spec = run.spec
    base = run.scratch / "int8-base.onnx"
    warns = int8_base(run.staged, base)
    tail, head = int8_search.decode_tail(onnx.load(str(base)))
    cands = run.scratch / "int8"
    cands.mkdir(exist_ok=True)

    def acc(path: Path) -> float:
        return measure_detector(path, run.input_name, run.full, run.ref, run.ref_dets,
                                run.det_truth, spec, run.hw, run.n_classes)["accuracy"]

    best, tried = int8_search.search(
        lambda dst, nodes, method: quantize_to(base, dst, run.calib_batches, run.input_name,
                                               nodes, method),
        acc, tail, head, run.entries[0].accuracy, cands,
        log=lambda m: log.info("%s: %s", run.model.name, m))
    run.search_log.extend(c.to_dict() for c in tried)
    if best is None:
        raise StepError("int8", "every int8 candidate failed: " + "; ".join(
            f"{c.exclude}/{c.method}: {c.error}" for c in tried))
    shutil.copy(best, p)
    return run.shape, warns


def _variant_steps(run: _Run) -> list[tuple[str, str, Callable]]:
    """(step, precision, make) for every form after fp32: fp16, int8, then the reduced
    resolutions (several for a detector, or where --sizes asks; else one at 2/3)."""
    spec, pre, shape = run.spec, run.pre, run.shape

    def fp16(p: Path) -> tuple[tuple[int, ...], list[str]]:
        make_fp16(run.fp32, p)
        return shape, []

    # a detector: the candidate count may change, the form may not; YOLO-style graphs need a
    # multiple of their largest stride (32) to run at all
    hw = run.hw
    multiple = run.meta.stride or (32 if all(d % 32 == 0 for d in hw) and min(hw) >= 64
                                   else 8)

    def reduced(p: Path, size: tuple[int, int] | None = None
                ) -> tuple[tuple[int, ...], list[str]]:
        if spec is None:
            return make_reduced(run.staged, p, run.input_name, shape, pre, size=size), []
        return make_reduced(run.staged, p, run.input_name, shape, pre,
                            lambda a, b: detection.form_change(a, b, spec.format,
                                                               run.n_classes),
                            multiple, size), []

    steps: list[tuple[str, str, Callable]] = [
        ("fp16", "fp16", fp16), ("int8", "int8", lambda p: _make_int8(run, p))]
    sizes = (given_sizes(hw, run.opts.sizes, multiple) if run.opts.sizes else
             detector_sizes(hw, multiple) if spec is not None else [])
    if run.opts.reduced and sizes:
        # several resolutions, each a rung the governor can step to
        steps += [("reduced", "fp32-reduced", lambda p, sz=sz: reduced(p, sz))
                  for sz in sizes]
    elif run.opts.reduced:
        steps.append(("reduced", "fp32-reduced", reduced))
    return steps


def _step_variants(run: _Run, progress: Callable[[str], None]) -> None:
    """Steps 2-4 with 5-6 for each form: make it, measure it, keep it or list why not. One
    form failing never loses the others."""
    model, stem, out = run.model, run.stem, run.out
    blocked = False  # a graph that does not run at one reduced size runs at none
    skip = {}
    if not run.calib_files:
        skip["int8"] = "skipped: no images to calibrate on (give --calib DIR or --val DIR)"
    if not run.val_files:
        skip["reduced"] = ("skipped: no images to measure a lower resolution on (generated "
                           "inputs say nothing about detail lost; give --val DIR)")
    for step, precision, make in _variant_steps(run):
        if step == "reduced" and blocked:
            continue
        if step in skip:
            blocked = blocked or step == "reduced"  # said once for every size
            log.warning("%s: variant %s%s %s", model.name, stem, step, skip[step])
            run.failed.append({"variant": f"{stem}{step}", "step": step, "error": skip[step],
                               "skipped": True})
            continue
        progress(step)
        path = out / f"{stem}{step}.onnx"
        try:
            new_shape, warns = make(path)
            for w in warns:
                log.warning("%s: %s", model.name, w)
            name = f"{stem}{step}"
            if step == "reduced":
                name = f"{stem}fp32-r{run.pre.hw(new_shape)[0]}"
                path = path.rename(out / f"{name}.onnx")
            _add_variant(run, name, step, precision, path, new_shape,
                         run.tensors(new_shape) if new_shape != run.shape else run.full,
                         progress)
        except Skipped as e:  # not possible for this graph: said why, not an error
            blocked = blocked or "does not run at" in e.message or "already the smallest" \
                in e.message
            log.warning("%s: variant %s%s %s", model.name, stem, step, e.message)
            run.failed.append({"variant": f"{stem}{step}", "step": e.step, "error": e.message,
                               "skipped": True})
            path.unlink(missing_ok=True)
        except Exception as e:  # one variant failing must not lose the others
            err = e if isinstance(e, StepError) else StepError(
                step, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
            log.error("%s: variant %s%s failed at step %s: %s; the other variants are kept",
                      model.name, stem, step, err.step, err.message)
            run.failed.append({"variant": f"{stem}{step}", "step": err.step,
                               "error": str(err)})
            path.unlink(missing_ok=True)


def _manifest_doc(run: _Run) -> dict:
    """This model's manifest: its variants, what failed, its eval set and how it was made."""
    evals: dict[str, dict] = {}
    if not run.generated:  # real images for engines to measure their own precisions on
        ev = run.out / f"{run.stem}eval.npz"
        n = _eval_set(run.val_images, run.hw, run.pre, run.truth, run.det_truth, ev)
        evals[run.model.name] = {"file": ev.name, "sha256": file_sha256(ev), "images": n,
                                 "basis": "labels" if run.labelled else "agreement"}
    verdict = run.verdict
    assert verdict is not None  # _step_reference ran
    doc = {
        "schema": SCHEMA, "name": run.opts.name, "labels": list(run.opts.labels),
        "preprocess": run.pre.to_dict(),
        "output": run.opts.output if run.spec is None else "detections",
        "accuracy_basis": "labels" if run.labelled else (
            "agreement" if run.val_files else "agreement-generated"),
        "accuracy_metric": _metric(run),
        "eval_images": len(run.val_images),
        "made_with": {"preprocess": run.pre_source, "labels": run.labels_source,
                      "input_shape": run.shape_from,
                      "reference": {"blind": verdict.blind, "kind": verdict.kind,
                                    "seen": verdict.seen}},
        "variants": [{**asdict(e), "input_shape": list(e.input_shape)} for e in run.entries],
        "failed": run.failed,
        "eval": evals,
    }
    if run.spec is not None:
        doc["postprocess"] = run.spec.to_dict()
    if run.search_log:  # every int8 candidate of a detector, measured (int8_search.py)
        doc["int8_search"] = {run.model.name: run.search_log}
    return doc


def _merge_existing(doc: dict, existing: dict, run: _Run, dest: Path) -> dict:
    """`doc` (a --prefix model's) added to the manifest it extends: that manifest's other
    variants, failures and eval sets kept, its name and provenance kept."""
    if existing.get("postprocess") != doc.get("postprocess"):
        raise ModelError(f"{dest / MANIFEST}: postprocessing differs from this model's "
                         f"({existing.get('postprocess')} vs {doc.get('postprocess')}); "
                         "variants in one manifest must share it")
    stem = run.stem
    keep = [v for v in existing["variants"] if not v["name"].startswith(stem)]
    doc["variants"] = keep + doc["variants"]
    doc["failed"] = [f for f in existing.get("failed", []) if not f["variant"].startswith(
        stem)] + doc["failed"]
    doc["name"] = existing["name"]
    doc["eval"] = {**{k: v for k, v in existing.get("eval", {}).items()
                      if k != run.model.name}, **doc["eval"]}
    doc["made_with"] = existing.get("made_with", doc["made_with"])
    if run.search_log or existing.get("int8_search"):
        doc["int8_search"] = {**existing.get("int8_search", {}),
                              **doc.get("int8_search", {})}
    return doc
