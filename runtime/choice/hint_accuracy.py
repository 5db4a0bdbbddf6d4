"""Accuracy of a precision an engine applies itself, measured through that engine.

A manifest's accuracy is the file's, measured with ONNX Runtime in fp32 math (or the file's
own fp16/int8). An engine can lower the math further on its own: OpenVINO's inference
precision hint (bf16, f16), OpenCV's DNN_TARGET_CPU_FP16, the OpenCL executor's fp16
storage. Such a variant is measured here, through its engine, on the ladder's stored
validation images (`eval` in the manifest, written by `models prepare`), before the selector
or the governor may use it:

- the variant's outputs and the same file's through ONNX Runtime (CPU, fp32 math) on the
  same images; with labels both are scored against them (top-1, or mAP@0.5 for a detector),
  without, the variant is scored against ONNX Runtime's outputs (top-1 agreement, or mAP
  against its detections) and the reference scores 1;
- its accuracy is the file's manifest accuracy x (variant's score / reference's score): what
  the engine's precision keeps of the file's, measured, applied to the file's figure, which
  was measured on every val image.

Without an eval set (a bare .onnx, or a ladder prepared without --val) or when the engine
fails on it, the variant has no measured accuracy and is excluded from the choice, with one
log line per reason. Results are cached beside the profiles, keyed by (model file, engine and
its version, device, precision hint, eval set).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from runtime.engine import detection
from runtime.engine.backends import Backend, Device, Variant
from runtime.engine.manifest import Manifest
from runtime.engine.onnx_model import file_sha256

log = logging.getLogger("edgerun.measure")

CACHE_SCHEMA = 1


def lowering(v: Variant) -> str | None:
    """The lower precision an engine applies to the file itself (an option), or None."""
    if (p := v.option("precision")) and p != "f32":
        return f"precision={p}"
    if v.option("target") == "cpu_fp16":
        return "target=cpu_fp16"
    if v.option("storage") == "fp16":
        return "storage=fp16"
    return None


@dataclass(frozen=True)
class Measured:
    """One lowered variant's measured accuracy (None: not measured, `why` says why)."""

    accuracy: float | None
    why: str
    score: float | None = None  # the variant's own score on the eval images
    reference: float | None = None  # the file's score through ONNX Runtime on them
    images: int = 0


@dataclass(frozen=True)
class EvalSet:
    """The validation images a ladder keeps (runtime/engine/prepare/write.py `eval_set`)."""

    images: np.ndarray  # [N, H, W, 3] BGR uint8 at the source model's full input size (decoded)
    truth: np.ndarray | None  # classifier labels
    det_truth: list[tuple[np.ndarray, np.ndarray]] | None  # detector boxes, classes
    sha256: str


def _decode(buf: np.ndarray, path: Path) -> np.ndarray:
    import cv2

    img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"{path}: an image that does not decode")
    return img


def load_eval(manifest: Manifest, source: str) -> EvalSet | str:
    """The eval set of the variants made from `source`, or why there is none."""
    if manifest.bare:
        return "a bare .onnx has no validation images (`edgerun models prepare --val` keeps some)"
    entry = manifest.eval_sets.get(source)
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        return ("the ladder keeps no validation images for it (prepared without --val, or "
                "before edgerun kept them)")
    path = manifest.root / Path(entry["file"]).name
    try:
        digest = file_sha256(path)
        if digest != entry.get("sha256"):
            return f"{path}: sha256 does not match the manifest's"
        with np.load(path, allow_pickle=False) as z:
            data, off = z["jpeg"], z["jpeg_offsets"]
            images = np.stack([_decode(data[a:b], path) for a, b in itertools.pairwise(off)])
            truth = z.get("truth", None)
            det = None
            if "offsets" in z:
                off, boxes, classes = z["offsets"], z["boxes"], z["classes"]
                det = [(boxes[a:b], classes[a:b]) for a, b in itertools.pairwise(off)]
    except (OSError, ValueError, KeyError) as e:
        return f"{path}: unreadable ({e})"
    if images.ndim != 4 or images.shape[3] != 3 or not len(images):
        return f"{path}: its images are not colour frames"
    return EvalSet(images, truth, det, digest)


def _score(outs: list[np.ndarray], manifest: Manifest, hw: tuple[int, int],
           against: list[np.ndarray] | None, ev: EvalSet) -> float:
    """Top-1 or mAP@0.5 of `outs` against the labels (when the set has them) or `against`."""
    if manifest.detect is None:
        top = np.array([int(np.argmax(o)) for o in outs])
        if against is None:
            return float((top == ev.truth).mean())
        return float((top == np.array([int(np.argmax(a)) for a in against])).mean())
    classes = len(manifest.labels) or None
    dets = [detection.detect(o, manifest.detect, hw, classes, score_threshold=0.001)
            for o in outs]
    if against is None:
        return detection.mean_ap(dets, ev.det_truth)
    ref = [detection.detect(a, manifest.detect, hw, classes) for a in against]
    return detection.mean_ap(dets, [(d.boxes, d.classes) for d in ref])


def measure(backend: Backend, v: Variant, manifest: Manifest, ev: EvalSet) -> Measured:
    """Run `v` through its engine and the file through ONNX Runtime on the eval images."""
    import onnxruntime as ort

    shape = v.model.input_shape
    hw = manifest.preprocess.hw(shape)
    tensors = [manifest.preprocess.apply(img, shape) for img in ev.images]
    try:
        session = backend.load(v)
        try:
            outs = [np.asarray(session.infer(t), np.float32) for t in tensors]
        finally:
            session.close()
        so = ort.SessionOptions()
        so.log_severity_level = 3
        ref_sess = ort.InferenceSession(str(v.model.path), so,
                                        providers=["CPUExecutionProvider"])
        ref = [ref_sess.run(None, {v.model.input_name: t})[0] for t in tensors]
    except Exception as e:  # an engine failing here fails this measurement only
        return Measured(None, f"{v.engine} failed on the eval images: "
                        f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
    if not all(np.all(np.isfinite(o)) for o in outs):
        return Measured(None, "NaN or Inf in its outputs on the eval images",
                        images=len(tensors))
    labelled = (ev.truth is not None) if manifest.detect is None else ev.det_truth is not None
    score = _score(outs, manifest, hw, None if labelled else ref, ev)
    reference = _score(ref, manifest, hw, None, ev) if labelled else 1.0
    base = v.model.accuracy
    if reference <= 0:
        return Measured(None, "the file itself scores 0 on the eval images", score, reference,
                        len(tensors))
    if base is None:
        return Measured(None, "the file's own accuracy is unknown", score, reference,
                        len(tensors))
    return Measured(base * score / reference, "measured", score, reference, len(tensors))


def _key(v: Variant, device: Device, ev_sha: str, file_sha: str) -> str:
    parts = [CACHE_SCHEMA, file_sha, v.engine, v.device, device.name,
             sorted(device.details.items()), lowering(v), ev_sha, v.model.accuracy,
             list(v.model.input_shape)]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _cached(cache: Path, key: str) -> Measured | None:
    try:
        d = json.loads((cache / f"hint-{key}.json").read_text())
        return Measured(**d)
    except (OSError, ValueError, TypeError):
        return None


def _store(cache: Path, key: str, m: Measured) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".hint-{key}.tmp"
        tmp.write_text(json.dumps(m.__dict__))
        tmp.replace(cache / f"hint-{key}.json")
    except OSError as e:
        log.warning("cannot cache a measured accuracy in %s (%s)", cache, e)


def apply(work: list[tuple[Backend, Device, Variant]], manifest: Manifest, cache_dir: str | Path,
          fresh: bool = False) -> list[tuple[Backend, Device, Variant]]:
    """`work` with every engine-lowered variant either carrying its measured accuracy or left
    out (one log line per engine, precision and reason). The other variants pass as they are."""
    cache = Path(os.path.expanduser(cache_dir))
    evals: dict[str, EvalSet | str] = {}
    done: dict[str, Measured] = {}
    hashes: dict[Path, str] = {}
    kept, left_out = [], {}
    for b, d, v in work:
        how = lowering(v)
        if how is None:
            kept.append((b, d, v))
            continue
        source = next((e.source for e in manifest.variants if e.name == v.model.precision),
                      manifest.variants[0].source)
        if source not in evals:
            evals[source] = load_eval(manifest, source)
        ev = evals[source]
        if isinstance(ev, str):
            left_out.setdefault((v.engine, how, ev), []).append(v.id)
            continue
        if v.model.path not in hashes:
            hashes[v.model.path] = file_sha256(v.model.path)
        key = _key(v, d, ev.sha256, hashes[v.model.path])
        m = done.get(key) or (None if fresh else _cached(cache, key))
        if m is None:
            m = measure(b, v, manifest, ev)
            _store(cache, key, m)
            if m.accuracy is not None:
                log.info("%s: %s measured through %s on %d eval images: accuracy %.4f (its "
                         "score %.4f, the file's through ONNX Runtime %.4f)", v.model.precision,
                         how, v.engine, m.images, m.accuracy, m.score, m.reference)
        done[key] = m
        if m.accuracy is None:
            left_out.setdefault((v.engine, how, m.why), []).append(v.id)
            continue
        kept.append((b, d, replace(v, model=replace(v.model, accuracy=m.accuracy))))
    for (engine, how, why), ids in left_out.items():
        log.info("%s %s: %d variant%s excluded from the choice: accuracy not measured (%s)",
                 engine, how, len(ids), "s" if len(ids) > 1 else "", why)
    return kept
