"""What an ONNX model says about itself, and the preprocessing and labels that follow from it.

ONNX files carry free-form `metadata_props` (key -> string). The convention read here is
Ultralytics' (REFERENCE.md "Model metadata and quantization"; its exporter writes these keys
for every YOLO export): `names` (a Python dict literal of class index -> name, parsed with
ast.literal_eval, never eval), `imgsz` (a list literal `[H, W]`), `stride` (the largest
stride), `task` (detect, classify, segment, pose, obb), `author` ("Ultralytics"). YOLO inputs
are RGB pixels / 255 with no mean or std, which is also edgerun's one default
(`DEFAULT_PREPROCESS`), so a bare .onnx and a prepared one start from the same numbers.

Every value is hostile until checked: a key that does not parse, or a `names` that is not
indices 0..n-1 mapped to strings, raises ModelError naming the file and the key. Whether
the values agree with the graph (names count vs the output's classes, imgsz vs the input) is
checked by `check_against` once the graph's shapes are known.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.engine.onnx_model import ModelError

# edgerun's one default preprocessing (docs/manifest.md "A bare .onnx"): pixels scaled to 0..1,
# RGB, nothing else: the most common export convention, YOLO's included. `layout` follows the
# model's input.
DEFAULT_PREPROCESS: dict[str, Any] = {"colour": "RGB", "resize": "bilinear", "scale": 1 / 255,
                                      "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
YOLO_TASKS = {"detect": "detect", "classify": "classify"}  # others edgerun does not decode
MAX_NAMES = 100_000  # a names literal larger than any real label set is refused, not parsed


@dataclass(frozen=True)
class ModelMeta:
    """The parts of a model's metadata edgerun uses; None where the model says nothing."""

    exporter: str | None = None  # "ultralytics" when its keys are there
    names: tuple[str, ...] | None = None
    imgsz: tuple[int, int] | None = None
    stride: int | None = None
    task: str | None = None  # as the model says it (detect, classify, segment, ...)

    def preprocess(self) -> dict[str, Any] | None:
        """The preprocessing the exporter's convention implies, or None (not known)."""
        return dict(DEFAULT_PREPROCESS) if self.exporter == "ultralytics" else None

    def edgerun_task(self) -> str | None:
        """The task as edgerun names it (detect | classify), None when unknown or another."""
        return YOLO_TASKS.get(self.task or "")


def props(proto: Any) -> dict[str, str]:
    """The model's metadata_props as a dict (a repeated key: the last one wins)."""
    return {p.key: p.value for p in getattr(proto, "metadata_props", ())}


def _literal(path: Path, key: str, text: str) -> Any:
    if len(text) > 4 * MAX_NAMES * 8:  # literal_eval of megabytes is slow; no label set is
        raise ModelError(f"{path}: metadata '{key}' is {len(text)} characters: too large")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
        raise ModelError(f"{path}: metadata '{key}' is not a Python literal "
                         f"({type(e).__name__}): {text[:80]!r}") from e


def _names(path: Path, text: str) -> tuple[str, ...]:
    v = _literal(path, "names", text)
    if isinstance(v, list | tuple):
        v = dict(enumerate(v))
    if not isinstance(v, dict) or not v:
        raise ModelError(f"{path}: metadata 'names' must be a non-empty dict of class index to "
                         f"name, got {type(v).__name__}")
    if len(v) > MAX_NAMES:
        raise ModelError(f"{path}: metadata 'names' has {len(v)} entries (at most {MAX_NAMES})")
    if sorted(v) != list(range(len(v))) or not all(isinstance(n, str) for n in v.values()):
        bad = next((k for k in sorted(v, key=str) if not isinstance(k, int) or not
                    isinstance(v[k], str)), None)
        raise ModelError(f"{path}: metadata 'names' must map the indices 0..{len(v) - 1} to "
                         f"strings" + (f" (key {bad!r})" if bad is not None else
                                       f" (indices {sorted(v)[:5]}...)"))
    return tuple(v[i].strip() or f"class_{i}" for i in range(len(v)))


def _imgsz(path: Path, text: str) -> tuple[int, int]:
    v = _literal(path, "imgsz", text)
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v, v]
    if (not isinstance(v, list | tuple) or len(v) != 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)):
        raise ModelError(f"{path}: metadata 'imgsz' must be [H, W] of positive integers, got "
                         f"{text[:40]!r}")
    return int(v[0]), int(v[1])


def read_meta(proto: Any, path: Path) -> ModelMeta:
    """The model's metadata (module doc); ModelError naming the file and the key for a value
    that does not parse."""
    p = props(proto)
    ultralytics = "names" in p and ("stride" in p or "imgsz" in p
                                    or "ultralytics" in p.get("author", "").lower())
    if not ultralytics:
        return ModelMeta()
    stride = None
    if "stride" in p:
        try:
            stride = int(p["stride"])
        except ValueError as e:
            raise ModelError(f"{path}: metadata 'stride' must be an integer, got "
                             f"{p['stride'][:40]!r}") from e
        if stride <= 0:
            raise ModelError(f"{path}: metadata 'stride' must be positive, got {stride}")
    return ModelMeta("ultralytics", _names(path, p["names"]),
                     _imgsz(path, p["imgsz"]) if "imgsz" in p else None, stride,
                     p.get("task") or None)


def default_input_shape(proto: Any, given: tuple[int, ...], meta: ModelMeta
                        ) -> tuple[tuple[int, ...], str]:
    """The input shape to fix dynamic dims with, and where it came from: given
    (--input-shape, [model] input_shape), else, for an input with a dynamic height or width,
    the metadata's imgsz; else () (the file's own)."""
    if given:
        return given, "--input-shape"
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    if len(inputs) != 1 or meta.imgsz is None:
        return (), "the file"
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or all(d is not None for d in dims[1:]):
        return (), "the file"
    h, w = meta.imgsz
    shape = (1, 3, h, w) if dims[1] in (3, None) and dims[3] != 3 else (1, h, w, 3)
    return shape, f"metadata imgsz {list(meta.imgsz)}"


def task_from_meta(meta: ModelMeta, path: Path, declared: str) -> str:
    """The task to decode: the declared one, else the metadata's (detect | classify), else
    auto. A task edgerun does not decode (segment, pose, obb: more outputs, or more per box)
    is refused unless one was declared."""
    if declared != "auto" or meta.task is None:
        return declared
    if (t := meta.edgerun_task()) is not None:
        return t
    raise ModelError(f"{path}: metadata 'task' is {meta.task!r}: edgerun decodes detect and "
                     "classify outputs only; declare the task (--task / [model] task) to run "
                     "it as one anyway")


def check_against(meta: ModelMeta, path: Path, input_hw: tuple[int, int] | None,
                  classes: int | None, dynamic_hw: bool = False) -> None:
    """ModelError naming the file and the key when the metadata contradicts the graph: a
    names count other than the output's classes, an imgsz other than a fixed input's H x W
    (a dynamic input may run at any size; imgsz is then only the exporter's)."""
    if meta.names is not None and classes is not None and len(meta.names) != classes:
        raise ModelError(f"{path}: metadata 'names' lists {len(meta.names)} classes but the "
                         f"output scores {classes}: the metadata does not describe this graph "
                         "(give --labels / [model] labels to override it)")
    if meta.imgsz is not None and input_hw is not None and not dynamic_hw \
            and tuple(meta.imgsz) != tuple(input_hw):
        raise ModelError(f"{path}: metadata 'imgsz' {list(meta.imgsz)} is not the input's "
                         f"{input_hw[0]}x{input_hw[1]}: the metadata does not describe this "
                         "graph")


@dataclass(frozen=True)
class Chosen:
    """A value and where it came from (file, flag, metadata, default), for the operator."""

    value: Any
    source: str


def choose_preprocess(given: dict[str, Any] | None, given_where: str, meta: ModelMeta
                      ) -> Chosen:
    """The preprocessing to use: what was given (a file or flag, `given_where` says which),
    else the metadata's convention, else the one default. The dict has no layout (it follows
    the input)."""
    if given:
        return Chosen({**DEFAULT_PREPROCESS, **given}, given_where)
    if (pre := meta.preprocess()) is not None:
        return Chosen(pre, f"metadata ({meta.exporter}: RGB pixels / 255)")
    return Chosen(dict(DEFAULT_PREPROCESS), "default (RGB pixels / 255)")


def choose_labels(given: tuple[str, ...], given_where: str, meta: ModelMeta) -> Chosen:
    """Class names: given (a labels file) win, else the metadata's `names`, else none."""
    if given:
        return Chosen(tuple(given), given_where)
    if meta.names:
        return Chosen(meta.names, f"metadata ({meta.exporter} 'names')")
    return Chosen((), "none")


def describe(pre: dict[str, Any]) -> str:
    """One readable line of a preprocessing dict: `RGB, x/255, mean 0 std 1, bilinear`."""
    scale = pre.get("scale", 1 / 255)
    s = "x/255" if abs(scale - 1 / 255) < 1e-12 else f"x*{scale:g}"
    mean, std = tuple(pre.get("mean", (0, 0, 0))), tuple(pre.get("std", (1, 1, 1)))
    ms = "mean 0 std 1" if all(m == 0 for m in mean) and all(d == 1 for d in std) else \
        f"mean {[round(float(m), 4) for m in mean]} std {[round(float(d), 4) for d in std]}"
    return (f"{pre.get('layout', 'NCHW')} {pre.get('colour', 'RGB')}, {s}, {ms}, "
            f"{pre.get('resize', 'bilinear')}")
