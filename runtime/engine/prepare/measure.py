"""Step 5: a variant's outputs against the fp32 reference's (and the labels), and the
reference's own verdict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.engine import detection, sanity
from runtime.engine.prepare.session import cpu_session


def measure(path: Path, input_name: str, tensors: list[np.ndarray], ref: np.ndarray,
            truth: np.ndarray | None) -> dict[str, float]:
    """Step 5 for one variant: outputs on every val tensor vs the fp32 reference."""
    sess = cpu_session(path)
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
    sess = cpu_session(path)
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


def judge_reference(raw: list[np.ndarray], ref: np.ndarray, ref_dets: list | None,
                    generated: bool) -> sanity.Verdict:
    """The fp32 reference's verdict (runtime/engine/sanity.py): on generated inputs only
    NaN and constant outputs count (no class share or box rate means anything on them)."""
    if generated:
        return sanity.judge(ref)
    if ref_dets is not None:
        return sanity.judge(ref, boxes=[len(d) for d in ref_dets])
    return sanity.judge(ref, top1=[int(i) for i in ref.argmax(1)])
