"""The manifest and its files: the eval set kept for engines, the manifest document (added
to an existing one with --prefix), and the move into the ladder folder, manifest last.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from runtime.engine.manifest import MANIFEST, SCHEMA, Preprocess
from runtime.engine.onnx_model import ModelError, file_sha256
from runtime.engine.prepare.errors import StepError
from runtime.engine.prepare.state import Run, metric

EVAL_IMAGES = 64  # val images kept in the ladder for engines to measure their own precisions


def eval_set(images: list[np.ndarray], hw: tuple[int, int], pre: Preprocess,
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


def manifest_doc(run: Run) -> dict:
    """This model's manifest: its variants, what failed, its eval set and how it was made."""
    evals: dict[str, dict] = {}
    if not run.generated:  # real images for engines to measure their own precisions on
        ev = run.out / f"{run.stem}eval.npz"
        n = eval_set(run.val_images, run.hw, run.pre, run.truth, run.det_truth, ev)
        evals[run.model.name] = {"file": ev.name, "sha256": file_sha256(ev), "images": n,
                                 "basis": "labels" if run.labelled else "agreement"}
    verdict = run.verdict
    assert verdict is not None  # step_reference ran
    doc = {
        "schema": SCHEMA, "name": run.opts.name, "labels": list(run.opts.labels),
        "preprocess": run.pre.to_dict(),
        "output": run.opts.output if run.spec is None else "detections",
        "accuracy_basis": "labels" if run.labelled else (
            "agreement" if run.val_files else "agreement-generated"),
        "accuracy_metric": metric(run),
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


def merge_existing(doc: dict, existing: dict, run: Run, dest: Path) -> dict:
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


def publish(stage: Path, out: Path) -> None:
    """Move a whole ladder from the scratch folder `stage` into `out`: the variants first, the
    manifest last (renamed into place), so `out` never holds a manifest naming a missing file."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(stage.iterdir()):  # variants first, the manifest last
        if f.name != MANIFEST:
            shutil.move(str(f), str(out / f.name))
    tmp = out / f".{MANIFEST}.tmp"
    shutil.move(str(stage / MANIFEST), str(tmp))
    tmp.replace(out / MANIFEST)
