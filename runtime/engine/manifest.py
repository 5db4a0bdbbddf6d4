"""Variant manifests: read, verify (sha256) and apply the declared pre/post-processing.

A model directory holds `manifest.json` (schema `edgerun.manifest/1`, see docs/manifest.md)
and the variant files it lists. Every file is hashed before use: a mismatch is an error that
names the file, never a silent load of something else. A bare `.onnx` file stands for a
manifest of one fp32 form whose accuracy is unknown (`bare_manifest`, docs/manifest.md
"A bare .onnx").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from runtime.config.schema import ConfigError, read_text
from runtime.engine.backends.base import ModelFile
from runtime.engine.detection import FORMATS, DetectSpec, guess_format, is_classifier_shape
from runtime.engine.model_meta import (
    DEFAULT_PREPROCESS,
    check_against,
    choose_labels,
    choose_preprocess,
    default_input_shape,
    read_meta,
    task_from_meta,
)
from runtime.engine.onnx_model import ModelError, file_sha256
from runtime.engine.tiling import TileSpec, detect_frame

SCHEMA = "edgerun.manifest/1"
MANIFEST = "manifest.json"

_RESIZE = {"bilinear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST, "area": cv2.INTER_AREA,
           "bicubic": cv2.INTER_CUBIC}


@dataclass(frozen=True)
class Preprocess:
    """How a BGR uint8 frame becomes the input tensor."""

    layout: str = "NCHW"  # NCHW | NHWC
    colour: str = "RGB"  # RGB | BGR
    resize: str = "bilinear"
    scale: float = 1 / 255
    # the one default (runtime.engine.model_meta.DEFAULT_PREPROCESS): pixels / 255, no mean/std
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Preprocess:
        """Validate a manifest's `preprocess` object; errors name `where`."""
        if not isinstance(d, dict):
            raise ModelError(f"{where}: preprocess must be an object, got {type(d).__name__}")
        known = {"layout", "colour", "resize", "scale", "mean", "std"}
        if unknown := set(d) - known:
            raise ModelError(f"{where}: preprocess: unknown key(s) {sorted(unknown)}")
        p = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        if p.layout not in ("NCHW", "NHWC") or p.colour not in ("RGB", "BGR"):
            raise ModelError(f"{where}: preprocess: layout must be NCHW/NHWC and colour RGB/BGR")
        if p.resize not in _RESIZE:
            raise ModelError(f"{where}: preprocess: resize must be one of {sorted(_RESIZE)}")
        # numbers, finite, checked here: `check` said ok to {"scale": "x"} and `serve` then
        # died in its warm-up with a numpy TypeError
        if not (_finite(p.scale) and p.scale > 0):
            raise ModelError(f"{where}: preprocess: scale must be a positive number, got "
                             f"{p.scale!r}")
        if not (isinstance(p.mean, tuple) and isinstance(p.std, tuple) and len(p.mean) == 3
                and len(p.std) == 3 and all(map(_finite, (*p.mean, *p.std)))
                and all(s != 0 for s in p.std)):
            raise ModelError(f"{where}: preprocess: mean and std need 3 finite numbers each, "
                             f"std non-zero; got mean {p.mean!r}, std {p.std!r}")
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        return {"layout": self.layout, "colour": self.colour, "resize": self.resize,
                "scale": self.scale, "mean": list(self.mean), "std": list(self.std)}

    def hw(self, input_shape: tuple[int, ...]) -> tuple[int, int]:
        """(H, W) of the model input for this layout."""
        return (input_shape[2], input_shape[3]) if self.layout == "NCHW" else (
            input_shape[1], input_shape[2])

    def apply(self, frames: np.ndarray | list[np.ndarray], input_shape: tuple[int, ...]
              ) -> np.ndarray:
        """BGR uint8 frames (HxWx3 each) -> a float32 batch shaped like `input_shape`."""
        h, w = self.hw(input_shape)
        if isinstance(frames, np.ndarray) and frames.ndim == 3:
            frames = [frames]
        nchw = self.layout == "NCHW"
        out = np.empty((len(frames), 3, h, w) if nchw else (len(frames), h, w, 3), np.float32)
        mean = np.asarray(self.mean, np.float32) / self.scale
        inv = (self.scale / np.asarray(self.std, np.float32)).astype(np.float32)
        order = (2, 1, 0) if self.colour == "RGB" else (0, 1, 2)  # source channel of each
        for i, f in enumerate(frames):
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ValueError(f"expected an HxWx3 uint8 frame, got {f.shape} {f.dtype}")
            if f.shape[:2] != (h, w):
                f = cv2.resize(f, (w, h), interpolation=_RESIZE[self.resize])
            # One channel plane at a time, written straight into its place in the layout: a
            # ufunc broadcasting the 3 means over the last axis runs an inner loop of 3
            # elements, ~7x slower on a 96x96 frame (0.2 ms, the size of the inference).
            for c, src in enumerate(order):
                plane = out[i, c] if nchw else out[i, :, :, c]
                np.subtract(f[:, :, src], mean[c], out=plane, dtype=np.float32)
                plane *= inv[c]
        return out


@dataclass(frozen=True)
class VariantEntry:
    """One variant listed in a manifest."""

    name: str  # unique within the manifest: fp32, fp16, int8, fp32-r64, small-fp32 ...
    precision: str
    file: str
    sha256: str
    input_name: str
    input_shape: tuple[int, ...]
    accuracy: float | None  # against labels, or agreement with fp32; None: unknown (bare)
    agreement: float  # top-1 agreement with the source fp32
    max_abs_diff: float | None  # None: a detector at another resolution (other candidates)
    mean_abs_diff: float | None
    size_bytes: int
    source: str  # which source model it was made from


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest and where it lives."""

    root: Path
    name: str
    labels: tuple[str, ...]
    preprocess: Preprocess
    output: str  # "probabilities" | "logits"
    variants: tuple[VariantEntry, ...]
    accuracy_basis: str  # "labels" | "agreement" | "agreement-generated" | "unknown" (bare)
    eval_images: int
    failed: tuple[dict, ...] = ()
    bare: bool = False  # root is a bare .onnx file, not a directory (accuracy unknown)
    detect: DetectSpec | None = None  # a detector's postprocessing; None: a classifier
    tiling: TileSpec | None = None  # from [model] tiling (detectors only), not the manifest
    # where the preprocessing and the labels came from (file, flag, metadata, default), for
    # `check` and `serve` to say
    preprocess_source: str = "manifest"
    labels_source: str = "manifest"
    # per source model: its kept validation images (`eval` in the manifest), what engines
    # measure their own precisions on (runtime/choice/hint_accuracy.py)
    eval_sets: dict[str, dict] = field(default_factory=dict)
    # `models prepare` judged its fp32 reference on images and found it sees something
    # (made_with.reference, runtime/engine/sanity.py): the first served frames, which show
    # the line and not a chosen set, are then judged only on what no scene explains
    reference_seen: bool = False

    def path(self, v: VariantEntry) -> Path:
        """Absolute path of a variant's file."""
        return self.root if self.bare else self.root / v.file

    def tile_hw(self, input_shape: tuple[int, ...]) -> tuple[int, int]:
        """The input (H, W) a variant's tiles are cut for: its source model's largest input
        (the full-resolution form's), so every rung of a ladder cuts a frame into the same
        tiles and a reduced-resolution rung resizes each tile down (fewer pixels, less work)
        instead of cutting more, smaller tiles at the same cost per frame."""
        shape = tuple(input_shape)
        own = self.preprocess.hw(shape)
        sources = {v.source for v in self.variants if tuple(v.input_shape) == shape}
        full = []  # each of those sources' full-resolution input
        for src in sources:
            full.append(max((self.preprocess.hw(tuple(v.input_shape)) for v in self.variants
                             if v.source == src), key=lambda hw: hw[0] * hw[1]))
        # the shape is the full-resolution input of one of them (a `--prefix` model made at
        # the size another's reduced form has): that model's own tiles. The rung cannot be
        # told from the reduced one by its shape, and a model cutting tiles larger than its
        # input (measured whole, on val images) would see every tiled frame scaled down
        if own in full:
            return own
        return max(full, key=lambda hw: hw[0] * hw[1], default=own)

    def variant(self, name: str) -> VariantEntry:
        """The entry called `name`; ModelError listing the names otherwise."""
        for v in self.variants:
            if v.name == name:
                return v
        raise ModelError(f"{self.root / MANIFEST}: no variant {name!r} "
                         f"(have {', '.join(v.name for v in self.variants)})")


def load_manifest(root: str | Path) -> Manifest:
    """Parse `root/manifest.json`; errors name the file and the field."""
    root = Path(root)
    path = root / MANIFEST
    doc = _read_json(path, "the manifest")
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: the manifest must be a JSON object, got "
                         f"{type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ModelError(f"{path}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    try:
        variants = tuple(
            VariantEntry(**{**v, "input_shape": tuple(v["input_shape"])}) for v in doc["variants"])
        made = doc.get("made_with", {}) if isinstance(doc.get("made_with"), dict) else {}
        return Manifest(root, doc["name"], tuple(doc["labels"]),
                        Preprocess.from_dict(doc["preprocess"], str(path)), doc["output"],
                        variants, doc["accuracy_basis"], doc["eval_images"],
                        tuple(doc.get("failed", ())),
                        detect=DetectSpec.from_dict(doc.get("postprocess", {}), str(path)),
                        preprocess_source=f"manifest (from {made['preprocess']})"
                        if isinstance(made.get("preprocess"), str) else "manifest",
                        labels_source=f"manifest (from {made['labels']})"
                        if isinstance(made.get("labels"), str) else "manifest",
                        eval_sets={k: v for k, v in doc.get("eval", {}).items()
                                   if isinstance(v, dict)}
                        if isinstance(doc.get("eval"), dict) else {},
                        reference_seen=isinstance(made.get("reference"), dict)
                        and made["reference"].get("blind") is False)
    except (KeyError, TypeError, AttributeError) as e:
        raise ModelError(f"{path}: missing or invalid field: {e}") from e


# What a bare .onnx is assumed to want (docs/manifest.md "A bare .onnx"): the one default,
# the same `models prepare` uses; the model's metadata or `[model] preprocess` override it.
BARE_PREPROCESS = DEFAULT_PREPROCESS
OUTPUTS = ("scores", "probabilities", "logits")


def _layout(shape: tuple[int, ...], path: Path) -> str:
    """NCHW or NHWC from where the 3 colour channels are; ModelError for anything else."""
    if len(shape) == 4 and shape[1] == 3:
        return "NCHW"
    if len(shape) == 4 and shape[3] == 3:
        return "NHWC"
    raise ModelError(f"{path}: input shape {list(shape)} is not a 3-channel image "
                     "([1, 3, H, W] or [1, H, W, 3]); edgerun feeds colour frames only")


def _output_classes(proto: Any) -> int | None:
    """The static size of the first output's last dimension, when the file declares one."""
    dims = proto.graph.output[0].type.tensor_type.shape.dim if proto.graph.output else []
    last = dims[-1] if dims else None
    return last.dim_value if last is not None and last.HasField("dim_value") else None


def _output_dims(proto: Any) -> list[tuple[str, tuple[int | str, ...]]]:
    """(name, declared dims) of every graph output; a symbolic dim is its name (or "?")."""
    out = []
    for o in proto.graph.output:
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in o.type.tensor_type.shape.dim)
        out.append((o.name, dims))
    return out


def _detector_classes(fmt: str, dims: tuple[int | str, ...], labels: tuple[str, ...]
                      ) -> int | None:
    """How many classes a detector output of `fmt` and `dims` scores (None: not fixed)."""
    if len(dims) != 3 or not all(isinstance(d, int) for d in dims[1:]):
        return None
    a, b = int(dims[1]), int(dims[2])
    if fmt == "yolov5":
        return b - 5
    if fmt == "yolov8":
        if labels:
            return len(labels) if len(labels) + 4 in (a, b) else min(a, b) - 4
        return min(a, b) - 4
    return None  # nms-inside: classes are indices, any number


def model_task(path: Path, outputs: list[tuple[str, tuple[int | str, ...]]], task: str,
               fmt: str, labels: tuple[str, ...]) -> str | None:
    """What a model's outputs say it is: None for a classifier, else its detector format.
    `task` and `fmt` are what was declared ("auto": guess from the shape; a guess is
    logged). A detector-shaped output declared or guessed as a classifier, or an output
    nothing fits, raises ModelError naming the file and the shape."""
    import logging

    log = logging.getLogger("edgerun.model")
    name, dims = outputs[0]
    shape = list(dims)
    names = ", ".join(f"{n} {list(d)}" for n, d in outputs)
    if task not in ("auto", "classify", "detect"):
        raise ModelError(f"{path}: task must be auto, classify or detect, got {task!r}")
    if fmt not in ("auto", *FORMATS):
        raise ModelError(f"{path}: format must be auto or one of {', '.join(FORMATS)}, "
                         f"got {fmt!r}")
    if len(outputs) > 1 and task != "classify" and fmt in ("auto", "nms-inside"):
        raise ModelError(f"{path}: {len(outputs)} outputs ({names}): a detector with NMS inside "
                         "(boxes, scores, classes). edgerun runs one output: make a ladder with "
                         "`edgerun models prepare --task detect --format nms-inside`, which "
                         "merges them into one [1, K, 6] output, and serve that")
    if task == "classify" or (task == "auto" and fmt == "auto" and is_classifier_shape(dims)):
        if not is_classifier_shape(dims):
            guess = guess_format(dims, len(labels) or None)
            raise ModelError(f"{path}: output '{name}' {shape} is not a classifier's "
                             f"[1, classes]: it looks like a detector"
                             f"{f' ({guess})' if guess else ''}. Set [model] task = \"detect\" "
                             "(and format) instead of scoring it as a classifier")
        return None
    if fmt != "auto":
        return fmt
    # labels settle an ambiguous shape; when they fit no form, the shape alone decides and
    # the label count is checked against it afterwards (an error naming both)
    guess = guess_format(dims, len(labels) or None) or (guess_format(dims) if labels else None)
    if guess is None:
        raise ModelError(f"{path}: output '{name}' {shape} is neither a classifier's [1, classes] "
                         "nor a detector form edgerun can tell from the shape (yolov8 "
                         "[1, 4+classes, N], yolov5 [1, N, 5+classes]); declare it with "
                         "[model] task = \"detect\" and format = \"yolov8\" | \"yolov5\" | "
                         "\"nms-inside\" (docs/detectors.md)")
    log.info("%s: output '%s' %s looks like a %s detector: decoded as one (set [model] task "
             "and format to override)", path, name, shape, guess)
    return guess


def bare_manifest(path: str | Path, input_shape: tuple[int, ...] = (),
                  labels: tuple[str, ...] = (), preprocess: dict[str, Any] | None = None,
                  output: str = "scores", task: str = "auto", fmt: str = "auto",
                  score_threshold: float = 0.25, iou_threshold: float = 0.45) -> Manifest:
    """A bare .onnx file as a one-variant manifest: fp32, accuracy unknown (None, which the
    selector takes as the reference 1.0). Dynamic dims are fixed by `input_shape` (a dynamic
    batch becomes 1); the layout follows the input (channels second: NCHW, last: NHWC) unless
    `preprocess` says otherwise; without labels, results say class_0, class_1, ... Raises
    ModelError naming the file for anything `serve` could not run."""
    from runtime.engine.onnx_model import load_onnx, model_input

    path = Path(path)
    if output not in OUTPUTS:
        raise ModelError(f"{path}: output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    proto = load_onnx(path)
    meta = read_meta(proto, path)
    inp = model_input(proto, path, default_input_shape(proto, input_shape, meta)[0])
    pre_chosen = choose_preprocess(preprocess, "file ([model] preprocess)", meta)
    lab_chosen = choose_labels(labels, "file ([model] labels)", meta)
    labels = lab_chosen.value
    pre = {**pre_chosen.value, "layout": _layout(inp.shape, path), **(preprocess or {})}
    pre = Preprocess.from_dict({k: list(v) if isinstance(v, tuple) else v
                                for k, v in pre.items()}, f"{path}: [model] preprocess")
    if pre.layout != _layout(inp.shape, path):
        raise ModelError(f"{path}: [model] preprocess says layout {pre.layout} but the input "
                         f"{list(inp.shape)} has its colour channels "
                         f"{'second (NCHW)' if inp.shape[1] == 3 else 'last (NHWC)'}")
    outputs = _output_dims(proto)
    task = task_from_meta(meta, path, task)
    fmt_ = model_task(path, outputs, task, fmt, labels)
    detect = None
    if fmt_ is not None:
        detect = DetectSpec.from_dict({"task": "detect", "format": fmt_,
                                       "score_threshold": score_threshold,
                                       "iou_threshold": iou_threshold}, f"{path}: [model]")
        classes = _detector_classes(fmt_, outputs[0][1], labels)
    else:
        classes = _output_classes(proto)
    dynamic_hw = any(isinstance(d, str) for d in inp.declared[1:])
    if lab_chosen.source.startswith("metadata"):
        check_against(meta, path, pre.hw(inp.shape), classes, dynamic_hw)
    else:
        check_against(replace(meta, names=None), path, pre.hw(inp.shape), classes, dynamic_hw)
    if labels and classes is not None and len(labels) != classes:
        raise ModelError(f"{path}: {len(labels)} labels given but the output "
                         f"'{proto.graph.output[0].name}' has {classes} classes")
    if not labels:
        labels = tuple(f"class_{i}" for i in range(classes or 0))
    entry = VariantEntry("fp32", "fp32", path.name, file_sha256(path), inp.name, inp.shape,
                         None, 1.0, 0.0, 0.0, path.stat().st_size, path.name)
    return Manifest(path, path.stem, labels, pre, output, (entry,), "unknown", 0, (), True,
                    detect, preprocess_source=pre_chosen.source,
                    labels_source=lab_chosen.source if lab_chosen.value else "none (class_N)")


def load_model(path: str | Path, input_shape: tuple[int, ...] = (),
               labels: tuple[str, ...] = (), preprocess: dict[str, Any] | None = None,
               output: str = "scores", **detector: Any) -> Manifest:
    """A model directory's manifest, or a bare .onnx file's (`bare_manifest`; the other
    arguments, `detector` ones included: task, fmt, score_threshold, iou_threshold, apply
    only to that)."""
    path = Path(path)
    if path.is_dir():
        return load_manifest(path)
    if not path.exists():
        raise ModelError(f"{path}: no such model file or directory ([model] path)")
    return bare_manifest(path, input_shape, labels, preprocess, output, **detector)


def hashed_files(root: str | Path) -> list[tuple[str, str, str]]:
    """(where in the manifest, file, sha256) of every file `root/manifest.json` names with a
    hash: its variants, its eval images (`eval`), any side file, wherever an object holds a
    string `file` and a string `sha256`. A bundle is checked against all of them
    (runtime/ota/bundle.py): what the manifest hashes decides what is served and how
    accurate it looks, so none of it may differ from what the publisher measured."""
    out: list[tuple[str, str, str]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("file"), str) and isinstance(node.get("sha256"), str):
                out.append((where or "(top)", node["file"], node["sha256"]))
            for k, v in node.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(_read_json(Path(root) / MANIFEST, "the manifest"), "")
    return out


def _finite(v: Any) -> bool:
    """A real, finite number (not a bool, not a string)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _read_small(path: Path, what: str) -> str:
    """The UTF-8 text of a regular file of at most 1 MiB (runtime.config.schema.read_text: a FIFO or
    /dev/zero named here hung `check` and `serve`, reading without end); ModelError naming
    the file otherwise."""
    try:
        return read_text(path)
    except ConfigError as e:
        msg = str(e)  # "<path>[:line]: cannot read: <why>" or "<path>:line: not UTF-8: ..."
        raise ModelError(msg.replace(": cannot read:", f": cannot read {what}:", 1)
                         if ": cannot read:" in msg else f"{msg} ({what})") from e


def _read_json(path: Path, what: str) -> Any:
    """`path` parsed as JSON; ModelError naming the file (deep nesting included)."""
    text = _read_small(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: line {e.lineno}: not valid JSON ({what}): {e.msg}") from e
    except RecursionError as e:
        raise ModelError(f"{path}: not valid JSON ({what}): nested too deeply") from e


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names, one per line (blank lines skipped); ModelError naming the file."""
    text = _read_small(Path(path), "labels")
    return tuple(x.strip() for x in text.splitlines() if x.strip())


def read_preprocess(path: str | Path) -> dict[str, Any]:
    """A preprocessing JSON (`{"preprocess": {...}}` or the object itself); ModelError naming
    the file."""
    doc = _read_json(Path(path), "preprocessing JSON")
    doc = doc.get("preprocess", doc) if isinstance(doc, dict) else doc
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: preprocessing JSON must be an object")
    return doc


def configured_model(path: str | Path, cfg: Any) -> Manifest:
    """The model at `path` with the `[model]` section `cfg` (runtime.config.ModelConfig):
    its labels, preprocess, output and detector keys apply to a bare .onnx only; `tiling`
    applies to any detector (docs/detectors.md)."""
    import logging
    from dataclasses import replace

    m = load_model(path, cfg.input_shape,
                   read_labels(cfg.labels) if cfg.labels else (),
                   read_preprocess(cfg.preprocess) if cfg.preprocess else None, cfg.output,
                   task=getattr(cfg, "task", "auto"), fmt=getattr(cfg, "format", "auto"),
                   score_threshold=getattr(cfg, "score_threshold", 0.25),
                   iou_threshold=getattr(cfg, "iou_threshold", 0.45))
    if m.bare and (cfg.labels or cfg.preprocess):  # name the files, not only the keys
        m = replace(m, labels_source=f"file {cfg.labels} ([model] labels)" if cfg.labels
                    else m.labels_source,
                    preprocess_source=f"file {cfg.preprocess} ([model] preprocess)"
                    if cfg.preprocess else m.preprocess_source)
    if getattr(cfg, "tiling", False):
        if m.detect is None:
            logging.getLogger("edgerun.model").warning(
                "%s: [model] tiling is for detectors; %s is a classifier, so frames are not "
                "tiled", path, m.name)
        else:
            m = replace(m, tiling=TileSpec(cfg.tile_size, cfg.tile_overlap))
    return m


def verify(manifest: Manifest, v: VariantEntry) -> Path:
    """The variant's path after checking its sha256; ModelError on a mismatch or absence."""
    path = manifest.path(v)
    try:
        digest = file_sha256(path)
    except OSError as e:
        raise ModelError(f"{path}: variant {v.name!r} listed in the manifest cannot be read: "
                         f"{e.strerror or e}") from e
    if digest != v.sha256:
        raise ModelError(f"{path}: sha256 {digest[:16]}... does not match the manifest's "
                         f"{v.sha256[:16]}... for variant {v.name!r}: refusing to load it "
                         "(corrupt or replaced file; re-run `edgerun models prepare`)")
    return path


def model_files(manifest: Manifest,
                on_bad: Callable[[VariantEntry, ModelError], None] | None = None
                ) -> list[ModelFile]:
    """Every verified variant as a ModelFile for the profiler. Without `on_bad` the first bad
    file raises; with it, bad variants are reported through it and skipped (the daemon keeps
    running on the good ones), and only a manifest with no good variant raises."""
    out = []
    for v in manifest.variants:
        try:
            path = verify(manifest, v)
        except ModelError as e:
            if on_bad is None:
                raise
            on_bad(v, e)
            continue
        out.append(ModelFile(manifest.name, v.name, path, v.input_name, v.input_shape,
                             v.accuracy))
    if not out:
        where = manifest.root if manifest.bare else manifest.root / MANIFEST
        raise ModelError(f"{where}: no variant passed verification")
    return out


def frame_result(out: np.ndarray, manifest: Manifest, frame_hw: tuple[int, int],
                 input_shape: tuple[int, ...]) -> dict[str, Any]:
    """The result fields of one frame's output: `label` and `score` for a classifier; for a
    detector also `boxes` and `counts` (runtime.engine.detection.to_result), tiles merged."""
    if manifest.detect is None:
        label, score = postprocess(out, manifest)[0]
        return {"label": label, "score": round(score, 5)}
    from runtime.engine.detection import to_result

    hw = manifest.preprocess.hw(input_shape)  # boxes are normalised by this variant's input
    d = detect_frame(out, manifest.detect, manifest.tiling, frame_hw, hw,
                     len(manifest.labels) or None, manifest.tile_hw(input_shape))
    return to_result(d, manifest.labels)


def postprocess(scores: np.ndarray, manifest: Manifest) -> list[tuple[str, float]]:
    """Per batch row: (label, score) of the top class: probabilities and scores as the model
    gives them, logits through a softmax."""
    s = np.asarray(scores, np.float32).reshape(scores.shape[0], -1)
    if manifest.output == "logits":
        e = np.exp(s - s.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
    top = s.argmax(axis=1)
    labels = manifest.labels
    fallback = "class_{}" if manifest.bare else "{}"
    return [(labels[i] if i < len(labels) else fallback.format(i), float(s[r, i]))
            for r, i in enumerate(top)]
