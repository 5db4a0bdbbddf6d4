"""Variant manifests: read, verify (sha256) and apply the declared pre/post-processing.

A model directory holds `manifest.json` (schema `edgerun.manifest/1`, see docs/manifest.md)
and the variant files it lists. Every file is hashed before use: a mismatch is an error that
names the file, never a silent load of something else.
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
    accuracy: float  # against labels when the manifest was made with labels, else agreement
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
    accuracy_basis: str  # "labels" | "agreement"
    eval_images: int
    failed: tuple[dict, ...] = ()

    def path(self, v: VariantEntry) -> Path:
        """Absolute path of a variant's file."""
        return self.root / v.file

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
        raise ModelError(f"{manifest.root / MANIFEST}: no variant passed verification")
    return out


def postprocess(scores: np.ndarray, manifest: Manifest) -> list[tuple[str, float]]:
    """Per batch row: (label, probability) of the top class."""
    s = np.asarray(scores, np.float32).reshape(scores.shape[0], -1)
    if manifest.output == "logits":
        e = np.exp(s - s.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
    top = s.argmax(axis=1)
    labels = manifest.labels
    return [(labels[i] if i < len(labels) else str(i), float(s[r, i])) for r, i in enumerate(top)]
