"""Object detectors: the manifest's `postprocess` for them, decode, NMS and mAP. Pure numpy.

Three output forms are understood (docs/detectors.md):

- ``yolov8`` (also v11, and anchor-free heads exported the same way): one output
  ``[1, 4 + C, N]``: rows cx, cy, w, h in input pixels, then C class scores; ``[1, N, 4 + C]``
  (the transpose) is read too;
- ``yolov5`` (also v7): one output ``[1, N, 5 + C]``: cx, cy, w, h, objectness, C class
  probabilities; a candidate's score is objectness x class probability;
- ``nms-inside``: the model did its own NMS: ``[1, K, 6]`` rows x1, y1, x2, y2, score, class
  (the end-to-end exports' form). A model with separate boxes, scores and classes outputs is
  brought to that form by `edgerun models prepare` (`merge_nms_outputs`): engines hand edgerun
  one output.

Boxes leave here normalised to the model input (0..1), which is also the frame's, because the
frame is resized to the input (no letterbox). Detections are (boxes xyxy, scores, classes)
arrays; `to_result` turns them into the result payload's `boxes` and `counts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.engine.onnx_model import ModelError

FORMATS = ("yolov8", "yolov5", "nms-inside")
TASKS = ("classify", "detect")
MAX_BOXES = 300  # per frame in a result: bounds the payload whatever the model emits


@dataclass(frozen=True)
class DetectSpec:
    """A detector's postprocessing, as declared in the manifest (or guessed for a bare file)."""

    format: str = "yolov8"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    coords: str = "pixels"  # "pixels" of the model input, or "normalised" (0..1)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> DetectSpec | None:
        """Validate a manifest's `postprocess` object; None for a classifier. Errors name
        `where` and the key."""
        if not isinstance(d, dict):
            raise ModelError(f"{where}: postprocess must be an object")
        known = {"task", "format", "score_threshold", "iou_threshold", "max_detections", "coords"}
        if unknown := set(d) - known:
            raise ModelError(f"{where}: postprocess: unknown key(s) {sorted(unknown)}")
        task = d.get("task", "classify")
        if task not in TASKS:
            raise ModelError(f"{where}: postprocess: task must be one of {', '.join(TASKS)}, "
                             f"got {task!r}")
        if task == "classify":
            return None
        spec = cls(**{k: v for k, v in d.items() if k != "task"})
        if spec.format not in FORMATS:
            raise ModelError(f"{where}: postprocess: format must be one of "
                             f"{', '.join(FORMATS)}, got {spec.format!r}")
        for key in ("score_threshold", "iou_threshold"):
            v = getattr(spec, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ModelError(f"{where}: postprocess: {key} must be within 0..1, got {v!r}")
        if not isinstance(spec.max_detections, int) or not 1 <= spec.max_detections <= MAX_BOXES:
            raise ModelError(f"{where}: postprocess: max_detections must be 1..{MAX_BOXES}, "
                             f"got {spec.max_detections!r}")
        if spec.coords not in ("pixels", "normalised"):
            raise ModelError(f"{where}: postprocess: coords must be pixels or normalised")
        return spec

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        return {"task": "detect", "format": self.format, "score_threshold": self.score_threshold,
                "iou_threshold": self.iou_threshold, "max_detections": self.max_detections,
                "coords": self.coords}


@dataclass(frozen=True)
class Detections:
    """Boxes (K,4 xyxy normalised to 0..1), scores (K,), class indices (K,)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def empty() -> Detections:
    """No detections."""
    return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32),
                      np.zeros(0, np.int64))


# -- shapes: what a detector's output looks like -----------------------------------------------

def guess_format(shape: tuple[int | str, ...], classes: int | None = None) -> str | None:
    """The YOLO form an output of `shape` has, or None when it is not detector-shaped (or
    ambiguous). `classes` (from labels) settles which axis holds the classes."""
    dims = [d for d in shape]
    if len(dims) != 3 or not all(isinstance(d, int) for d in dims[1:]):
        return None
    a, b = int(dims[1]), int(dims[2])
    if classes is not None:
        if a == 4 + classes and b != 4 + classes:
            return "yolov8"
        if b == 4 + classes:
            return "yolov8"  # the transposed export
        if b == 5 + classes:
            return "yolov5"
        if b == 6 and classes != 1:
            return "nms-inside"
        return None
    if 5 <= a < b:
        return "yolov8"  # ultralytics' own layout: candidates last, far more of them
    if b == 6 and a > b:
        return None  # [1, K, 6]: NMS-inside or a one-class yolov5: only a declaration says
    if 6 <= b < a:
        return "yolov5"
    return None


def _yolov8_rows_first(a: int, b: int, n_classes: int | None) -> bool:
    """Whether a yolov8 output [1, a, b] has its candidates as columns (what `decode` reads)."""
    return (a == 4 + n_classes != b) if n_classes is not None else a < b


def form_change(full: tuple[int, ...], other: tuple[int, ...], fmt: str,
                n_classes: int | None = None) -> str | None:
    """Why an output of shape `other` (the same detector at another input resolution) is not
    the same detector form as `full`, or None when it is: the candidate count may differ,
    nothing else (the per-candidate attributes, and for yolov8 which axis holds them, as
    `decode` reads it)."""
    if len(other) != len(full) or len(full) != 3 or other[0] != full[0]:
        return f"output rank or batch changes ({list(full)} -> {list(other)})"
    if fmt == "yolov8":
        ra = _yolov8_rows_first(full[1], full[2], n_classes)
        rb = _yolov8_rows_first(other[1], other[2], n_classes)
        attrs_a, attrs_b = full[1 if ra else 2], other[1 if rb else 2]
        if ra != rb:
            return (f"yolov8 output {list(full)} -> {list(other)}: {min(other[1:])} "
                    f"candidates, too few to tell them from the {attrs_a} box+class rows")
        if attrs_a != attrs_b:
            return (f"yolov8 output {list(full)} -> {list(other)}: the box+class rows change "
                    f"({attrs_a} -> {attrs_b})")
        return None
    if other[2] != full[2]:  # yolov5 [1, N, 5 + C], nms-inside [1, K, 6]
        return f"{fmt} output {list(full)} -> {list(other)}: the last axis changes"
    return None


def is_classifier_shape(shape: tuple[int | str, ...]) -> bool:
    """One score per class: [N, C], [C], or any shape whose other dims are all 1
    ([N, C, 1, 1], [1, 1, C])."""
    if len(shape) <= 2:
        return True
    return sum(1 for d in shape[1:] if d != 1) <= 1


# -- decode --------------------------------------------------------------------------------------

def _xywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    half = b[:, 2:4] / 2
    return np.concatenate([b[:, :2] - half, b[:, :2] + half], 1)


def decode(out: np.ndarray, spec: DetectSpec, input_hw: tuple[int, int],
           n_classes: int | None = None, score_threshold: float | None = None) -> Detections:
    """One image's raw output (batch dim first, batch of 1) -> candidates above the score
    threshold, boxes normalised to the input. No NMS here (`detect` does it). ValueError when
    the output does not have the declared form."""
    thr = spec.score_threshold if score_threshold is None else score_threshold
    a = np.asarray(out, np.float32)
    if a.ndim == 3:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(f"a {spec.format} output must be [1, rows, cols], got {list(out.shape)}")
    h, w = input_hw
    if spec.format == "yolov8":
        if _yolov8_rows_first(a.shape[0], a.shape[1], n_classes):  # [4 + C, N]: columns
            a = a.T
        elif n_classes is not None and a.shape[1] != 4 + n_classes:
            raise ValueError(f"yolov8 output {list(out.shape)} has no axis of 4 + {n_classes} "
                             "classes")
        boxes, cls_scores = a[:, :4], a[:, 4:]
    elif spec.format == "yolov5":
        if a.shape[1] < 6 or (n_classes is not None and a.shape[1] != 5 + n_classes):
            raise ValueError(f"yolov5 output {list(out.shape)} is not [1, N, 5 + classes]")
        boxes, cls_scores = a[:, :4], a[:, 5:] * a[:, 4:5]
    else:  # nms-inside: [K, 6] x1 y1 x2 y2 score class
        if a.shape[1] != 6:
            raise ValueError(f"nms-inside output {list(out.shape)} is not [1, K, 6]")
        keep = a[:, 4] >= thr
        b = a[keep]
        scale = np.array([1, 1, 1, 1], np.float32) if spec.coords == "normalised" else \
            np.array([w, h, w, h], np.float32)
        return Detections(np.clip(b[:, :4] / scale, 0, 1), b[:, 4].copy(),
                          b[:, 5].astype(np.int64))
    if cls_scores.shape[1] == 0:
        raise ValueError(f"{spec.format} output {list(out.shape)} has no class scores")
    cls = cls_scores.argmax(1)
    scores = cls_scores[np.arange(len(cls)), cls]
    keep = scores >= thr
    boxes = _xywh_to_xyxy(boxes[keep])
    if spec.coords == "pixels":
        boxes = boxes / np.array([w, h, w, h], np.float32)
    return Detections(np.clip(boxes, 0, 1).astype(np.float32), scores[keep].astype(np.float32),
                      cls[keep].astype(np.int64))


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: (len(a), len(b))."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def nms(d: Detections, iou_threshold: float, max_detections: int = MAX_BOXES) -> Detections:
    """Class-wise greedy NMS: highest score first, a box suppresses the same class's boxes
    overlapping it by more than `iou_threshold`. Boxes of different classes never suppress
    each other (a dent inside a stain is two findings)."""
    if len(d) == 0:
        return d
    order = np.argsort(-d.scores, kind="stable")
    boxes, classes = d.boxes[order], d.classes[order]
    overlap = iou(boxes, boxes)
    same = classes[:, None] == classes[None, :]
    suppressed = np.zeros(len(order), bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) >= max_detections:
            break
        suppressed |= same[i] & (overlap[i] > iou_threshold)
    idx = order[keep]
    return Detections(d.boxes[idx], d.scores[idx], d.classes[idx])


def detect(out: np.ndarray, spec: DetectSpec, input_hw: tuple[int, int],
           n_classes: int | None = None, score_threshold: float | None = None) -> Detections:
    """Decode + class-wise NMS (an NMS-inside model's own result is only thresholded)."""
    d = decode(out, spec, input_hw, n_classes, score_threshold)
    if spec.format == "nms-inside":
        order = np.argsort(-d.scores, kind="stable")[:spec.max_detections]
        return Detections(d.boxes[order], d.scores[order], d.classes[order])
    return nms(d, spec.iou_threshold, spec.max_detections)


def label_of(i: int, labels: tuple[str, ...]) -> str:
    """A class index's name (class_<i> beyond the labels)."""
    return labels[i] if 0 <= i < len(labels) else f"class_{i}"


def to_result(d: Detections, labels: tuple[str, ...]) -> dict[str, Any]:
    """The result fields of a detector: `label`/`score` of the best box ("none", 0.0 without
    one), `boxes` (normalised centre x, y, width, height, label, score; best first) and
    per-label `counts`."""
    order = np.argsort(-d.scores, kind="stable")[:MAX_BOXES]
    boxes, counts = [], {}
    for i in order:
        x0, y0, x1, y1 = (float(v) for v in d.boxes[i])
        name = label_of(int(d.classes[i]), labels)
        boxes.append({"label": name, "score": round(float(d.scores[i]), 5),
                      "x": round((x0 + x1) / 2, 5), "y": round((y0 + y1) / 2, 5),
                      "w": round(x1 - x0, 5), "h": round(y1 - y0, 5)})
        counts[name] = counts.get(name, 0) + 1
    best = boxes[0] if boxes else None
    return {"label": best["label"] if best else "none",
            "score": best["score"] if best else 0.0, "boxes": boxes, "counts": counts}


# -- mAP -----------------------------------------------------------------------------------------

def average_precision(tp: np.ndarray, scores: np.ndarray, n_truth: int) -> float:
    """All-point interpolated AP (VOC 2010+/COCO style) of one class's ranked detections."""
    if n_truth == 0:
        return float("nan")
    if len(scores) == 0:
        return 0.0
    order = np.argsort(-scores, kind="stable")
    hits = tp[order].astype(np.float64)
    ctp, cfp = np.cumsum(hits), np.cumsum(1 - hits)
    recall = ctp / n_truth
    precision = ctp / np.maximum(ctp + cfp, 1e-12)
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[1.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    step = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[step + 1] - r[step]) * p[step + 1]))


def mean_ap(preds: list[Detections], truths: list[tuple[np.ndarray, np.ndarray]],
            iou_threshold: float = 0.5) -> float:
    """mAP@`iou_threshold` over the classes present in the truth. `truths[i]` is image i's
    (boxes xyxy normalised, class indices). A prediction is a true positive when it matches an
    unmatched truth box of its class by IoU >= the threshold (best-scoring first). Images with
    no truth and no prediction count for nothing; 1.0 when there is no truth box at all and no
    prediction (nothing to find, nothing claimed), 0.0 when there are only false alarms."""
    per_class: dict[int, tuple[list, list]] = {}
    n_truth: dict[int, int] = {}
    for d, (tb, tc) in zip(preds, truths, strict=True):
        for c in np.unique(tc):
            n_truth[int(c)] = n_truth.get(int(c), 0) + int((tc == c).sum())
        for c in np.unique(d.classes):
            mask = d.classes == c
            boxes, scores = d.boxes[mask], d.scores[mask]
            order = np.argsort(-scores, kind="stable")
            truth = tb[tc == c]
            used = np.zeros(len(truth), bool)
            ov = iou(boxes[order], truth) if len(truth) else np.zeros((len(order), 0))
            hits = np.zeros(len(order), bool)
            for k in range(len(order)):
                if ov.shape[1] == 0:
                    break
                cand = np.where(used, -1.0, ov[k])
                j = int(cand.argmax())
                if cand[j] >= iou_threshold:
                    used[j], hits[k] = True, True
            tp, sc = per_class.setdefault(int(c), ([], []))
            tp.append(hits)
            sc.append(scores[order])
    if not n_truth:
        return 0.0 if any(len(d) for d in preds) else 1.0
    aps = []
    for c, n in n_truth.items():
        tp, sc = per_class.get(c, ([], []))
        aps.append(average_precision(np.concatenate(tp) if tp else np.zeros(0, bool),
                                     np.concatenate(sc) if sc else np.zeros(0), n))
    return float(np.mean(aps))


def read_yolo_labels(path: Any, classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A YOLO label file (`class cx cy w h` per line, normalised) -> (boxes xyxy, classes).
    ValueError naming the line for anything else, or for a class index not below `classes`
    (the labels list's length, when known: a mismatched classes.txt)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            c, cx, cy, w, h = int(parts[0]), *(float(x) for x in parts[1:5])
        except (ValueError, IndexError):
            raise ValueError(f"{path}: line {n}: expected `class cx cy w h`, got {line!r}"
                             ) from None
        if len(parts) != 5 or c < 0 or not all(0 <= v <= 1 for v in (cx, cy, w, h)):
            raise ValueError(f"{path}: line {n}: expected `class cx cy w h` with a class >= 0 "
                             f"and normalised 0..1 values, got {line!r}")
        if classes is not None and c >= classes:
            raise ValueError(f"{path}: line {n}: class {c} is past the {classes} labels given "
                             f"(0..{classes - 1}): a label list that does not match the label "
                             "files?")
        rows.append((c, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
    a = np.array(rows, np.float64).reshape(-1, 5)
    return a[:, 1:].astype(np.float32), a[:, 0].astype(np.int64)
