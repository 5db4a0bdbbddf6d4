"""Variant manifests: read, verify (sha256) and apply the declared pre/post-processing.

A model directory holds `manifest.json` (schema `edgerun.manifest/1`, see docs/manifest.md)
and the variant files it lists. Every file is hashed before use: a mismatch is an error that
names the file, never a silent load of something else. A bare `.onnx` file stands for a
manifest of one fp32 form whose accuracy is unknown (`bare_manifest`, docs/manifest.md
"A bare .onnx").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from runtime.backends.base import ModelFile
from runtime.onnx_model import ModelError, file_sha256

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
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Preprocess:
        """Validate a manifest's `preprocess` object; errors name `where`."""
        known = {"layout", "colour", "resize", "scale", "mean", "std"}
        if unknown := set(d) - known:
            raise ModelError(f"{where}: preprocess: unknown key(s) {sorted(unknown)}")
        p = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        if p.layout not in ("NCHW", "NHWC") or p.colour not in ("RGB", "BGR"):
            raise ModelError(f"{where}: preprocess: layout must be NCHW/NHWC and colour RGB/BGR")
        if p.resize not in _RESIZE:
            raise ModelError(f"{where}: preprocess: resize must be one of {sorted(_RESIZE)}")
        if len(p.mean) != 3 or len(p.std) != 3 or any(s == 0 for s in p.std):
            raise ModelError(f"{where}: preprocess: mean and std need 3 values, std non-zero")
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
        out = np.empty((len(frames), h, w, 3), np.float32)
        mean = np.asarray(self.mean, np.float32) / self.scale
        inv = (self.scale / np.asarray(self.std, np.float32)).astype(np.float32)
        for i, f in enumerate(frames):
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ValueError(f"expected an HxWx3 uint8 frame, got {f.shape} {f.dtype}")
            if f.shape[:2] != (h, w):
                f = cv2.resize(f, (w, h), interpolation=_RESIZE[self.resize])
            if self.colour == "RGB":
                f = f[..., ::-1]
            np.multiply(np.subtract(f, mean, dtype=np.float32), inv, out=out[i])
        return np.ascontiguousarray(out.transpose(0, 3, 1, 2)) if self.layout == "NCHW" else out


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
    max_abs_diff: float
    mean_abs_diff: float
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

    def path(self, v: VariantEntry) -> Path:
        """Absolute path of a variant's file."""
        return self.root if self.bare else self.root / v.file

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
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ModelError(f"{path}: cannot read the manifest: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: line {e.lineno}: not valid JSON: {e.msg}") from e
    if doc.get("schema") != SCHEMA:
        raise ModelError(f"{path}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    try:
        variants = tuple(
            VariantEntry(**{**v, "input_shape": tuple(v["input_shape"])}) for v in doc["variants"])
        return Manifest(root, doc["name"], tuple(doc["labels"]),
                        Preprocess.from_dict(doc["preprocess"], str(path)), doc["output"],
                        variants, doc["accuracy_basis"], doc["eval_images"],
                        tuple(doc.get("failed", ())))
    except (KeyError, TypeError) as e:
        raise ModelError(f"{path}: missing or invalid field: {e}") from e


# What a bare .onnx is assumed to want (docs/manifest.md "A bare .onnx"): pixels scaled to
# 0..1 and nothing else, the most common export convention; `[model] preprocess` overrides it.
BARE_PREPROCESS = {"colour": "RGB", "resize": "bilinear", "scale": 1 / 255,
                   "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
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


def bare_manifest(path: str | Path, input_shape: tuple[int, ...] = (),
                  labels: tuple[str, ...] = (), preprocess: dict[str, Any] | None = None,
                  output: str = "scores") -> Manifest:
    """A bare .onnx file as a one-variant manifest: fp32, accuracy unknown (None, which the
    selector takes as the reference 1.0). Dynamic dims are fixed by `input_shape` (a dynamic
    batch becomes 1); the layout follows the input (channels second: NCHW, last: NHWC) unless
    `preprocess` says otherwise; without labels, results say class_0, class_1, ... Raises
    ModelError naming the file for anything `serve` could not run."""
    from runtime.onnx_model import load_onnx, model_input

    path = Path(path)
    if output not in OUTPUTS:
        raise ModelError(f"{path}: output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    proto = load_onnx(path)
    inp = model_input(proto, path, input_shape)
    pre = {**BARE_PREPROCESS, "layout": _layout(inp.shape, path), **(preprocess or {})}
    pre = Preprocess.from_dict({k: list(v) if isinstance(v, tuple) else v
                                for k, v in pre.items()}, f"{path}: [model] preprocess")
    if pre.layout != _layout(inp.shape, path):
        raise ModelError(f"{path}: [model] preprocess says layout {pre.layout} but the input "
                         f"{list(inp.shape)} has its colour channels "
                         f"{'second (NCHW)' if inp.shape[1] == 3 else 'last (NHWC)'}")
    classes = _output_classes(proto)
    if labels and classes is not None and len(labels) != classes:
        raise ModelError(f"{path}: {len(labels)} labels given but the output "
                         f"'{proto.graph.output[0].name}' has {classes} classes")
    if not labels:
        labels = tuple(f"class_{i}" for i in range(classes or 0))
    entry = VariantEntry("fp32", "fp32", path.name, file_sha256(path), inp.name, inp.shape,
                         None, 1.0, 0.0, 0.0, path.stat().st_size, path.name)
    return Manifest(path, path.stem, labels, pre, output, (entry,), "unknown", 0, (), True)


def load_model(path: str | Path, input_shape: tuple[int, ...] = (),
               labels: tuple[str, ...] = (), preprocess: dict[str, Any] | None = None,
               output: str = "scores") -> Manifest:
    """A model directory's manifest, or a bare .onnx file's (`bare_manifest`; the other
    arguments apply only to that)."""
    path = Path(path)
    if path.is_dir():
        return load_manifest(path)
    if not path.exists():
        raise ModelError(f"{path}: no such model file or directory ([model] path)")
    return bare_manifest(path, input_shape, labels, preprocess, output)


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names, one per line (blank lines skipped); ModelError naming the file."""
    try:
        return tuple(x.strip() for x in Path(path).read_text().splitlines() if x.strip())
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read labels: {getattr(e, 'strerror', None) or e}"
                         ) from e


def read_preprocess(path: str | Path) -> dict[str, Any]:
    """A preprocessing JSON (`{"preprocess": {...}}` or the object itself); ModelError naming
    the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: cannot read preprocessing JSON: {e}") from e
    doc = doc.get("preprocess", doc) if isinstance(doc, dict) else doc
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: preprocessing JSON must be an object")
    return doc


def configured_model(path: str | Path, cfg: Any) -> Manifest:
    """The model at `path` with the `[model]` section `cfg` (runtime.config.ModelConfig):
    its labels, preprocess and output keys apply to a bare .onnx only."""
    return load_model(path, cfg.input_shape,
                      read_labels(cfg.labels) if cfg.labels else (),
                      read_preprocess(cfg.preprocess) if cfg.preprocess else None, cfg.output)


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
