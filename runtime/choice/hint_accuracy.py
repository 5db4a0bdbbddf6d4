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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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


@dataclass
class _Pass:
    """What scoring keeps of one engine's outputs on the eval images, image by image: the
    top-1 (a classifier) or the detections above 0.001 (a detector; with `strict`, also at
    the decoder's own threshold, what a reference is compared at)."""

    picks: list = field(default_factory=list)
    strict: list = field(default_factory=list)
    finite: bool = True


def _run(infer: Callable[[np.ndarray], np.ndarray], manifest: Manifest, ev: EvalSet,
         shape: tuple[int, ...], reference: bool = False, strict: bool = False) -> _Pass:
    """Every eval image preprocessed, run and reduced before the next: one input tensor and
    one output alive at a time. Holding them all (as this did) cost 64 float32 inputs and 64
    outputs at once: little for a 96 px classifier, ~300 MB of inputs and as much of outputs
    for a 640 px detector, on a cold start's memory peak. A variant's pass stops at its first
    NaN or Inf (it fails); the `reference` pass (the file through ONNX Runtime) is scored as
    it comes."""
    hw = manifest.preprocess.hw(shape)
    classes = len(manifest.labels) or None
    got = _Pass()
    for img in ev.images:
        out = np.asarray(infer(manifest.preprocess.apply(img, shape)), np.float32)
        if not reference and not np.all(np.isfinite(out)):
            got.finite = False  # the variant fails as a whole: nothing to score
            break
        if manifest.detect is None:
            got.picks.append(int(np.argmax(out)))
            continue
        got.picks.append(detection.detect(out, manifest.detect, hw, classes,
                                          score_threshold=0.001))
        if strict:
            got.strict.append(detection.detect(out, manifest.detect, hw, classes))
    return got


def _score(got: _Pass, manifest: Manifest, against: _Pass | None, ev: EvalSet) -> float:
    """Top-1 or mAP@0.5 of a pass against the labels (`against` None) or another pass."""
    if manifest.detect is None:
        top = np.array(got.picks)
        if against is None:
            return float((top == ev.truth).mean())
        return float((top == np.array(against.picks)).mean())
    if against is None:
        return detection.mean_ap(got.picks, ev.det_truth)
    return detection.mean_ap(got.picks, [(d.boxes, d.classes) for d in against.strict])


def measure(backend: Backend, v: Variant, manifest: Manifest, ev: EvalSet) -> Measured:
    """Run `v` through its engine and the file through ONNX Runtime on the eval images, one
    image at a time, one engine after the other."""
    import onnxruntime as ort

    shape = v.model.input_shape
    labelled = (ev.truth is not None) if manifest.detect is None else ev.det_truth is not None
    try:
        session = backend.load(v)
        try:
            outs = _run(session.infer, manifest, ev, shape)
        finally:
            session.close()
        so = ort.SessionOptions()
        so.log_severity_level = 3
        ref_sess = ort.InferenceSession(str(v.model.path), so,
                                        providers=["CPUExecutionProvider"])
        name = v.model.input_name
        ref = _run(lambda t: ref_sess.run(None, {name: t})[0], manifest, ev, shape,
                   reference=True, strict=not labelled)
    except Exception as e:  # an engine failing here fails this measurement only
        return Measured(None, f"{v.engine} failed on the eval images: "
                        f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
    if not outs.finite:
        return Measured(None, "NaN or Inf in its outputs on the eval images",
                        images=len(ev.images))
    score = _score(outs, manifest, None if labelled else ref, ev)
    reference = _score(ref, manifest, None, ev) if labelled else 1.0
    base = v.model.accuracy
    if reference <= 0:
        return Measured(None, "the file itself scores 0 on the eval images", score, reference,
                        len(ev.images))
    if base is None:
        return Measured(None, "the file's own accuracy is unknown", score, reference,
                        len(ev.images))
    return Measured(base * score / reference, "measured", score, reference, len(ev.images))


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
