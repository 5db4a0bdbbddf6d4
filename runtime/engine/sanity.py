"""Is a model seeing anything? The judgement on a run of its outputs, pure and table-tested.

Agreement with an fp32 reference means something only when the reference does something: a
YOLO detector fed ImageNet-normalised pixels finds no box in any image, and every rung then
"agrees" with it perfectly. `models prepare` judges the fp32 reference on the val
images before it measures anything; the pipeline judges a served model over its first frames
(`FirstFrames`) and raises a `model_blind` event. Both use `judge`.

Degenerate means one of (in this order):
- non-finite: NaN or Inf in any output;
- constant: every output the same (within 1e-6 of its scale) over at least 2 inputs;
- a detector with boxes (at its serving score threshold) in fewer than MIN_BOX_SHARE of the
  inputs;
- a classifier whose top-1 is one class for at least ONE_CLASS_SHARE of the inputs (with
  more than one class and at least MIN_INPUTS inputs: on 3 images one class is no evidence).

The last two say as much about the inputs as about the model: on a line a defect detector
finds nothing in good parts and an inspection classifier says "ok" for most of them (an
outside run, 2026-12-07: the bundled model, right on 49 of its first 50 frames, raised
`model_blind` for "top-1 class 0 for 48 of 50"). So the first served frames of a model whose
reference `models prepare` has seen see something (the manifest's `made_with.reference`) are
judged on non-finite and constant outputs only; a bare model, or one prepared without that
evidence, on all four.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.wire.events import EventType

MIN_INPUTS = 8  # fewer inputs say nothing about a class share or a box rate
MIN_BOX_SHARE = 0.1  # a detector finding a box in under 1 image in 10 is taken as blind
ONE_CLASS_SHARE = 0.95  # a classifier giving one class for 95 % of the inputs is taken as blind
FIRST_FRAMES = 50  # frames the pipeline judges a served model on


@dataclass(frozen=True)
class Verdict:
    """The judgement: `blind` and, either way, what was seen (one line for an operator)."""

    blind: bool
    kind: str  # ok | non-finite | constant | no-boxes | one-class | too-few
    seen: str


def judge(outputs: np.ndarray, *, boxes: list[int] | None = None,
          top1: list[int] | None = None) -> Verdict:
    """Judge N inputs' outputs: `outputs` [N, ...] raw (flattened per input), and for a
    detector `boxes` (boxes kept per input) or for a classifier `top1` (class per input)."""
    n = int(outputs.shape[0]) if outputs.ndim else 0
    if n == 0:
        return Verdict(False, "too-few", "no inputs")
    flat = np.asarray(outputs, np.float64).reshape(n, -1)
    bad = int((~np.isfinite(flat)).any(axis=1).sum())
    if bad:
        return Verdict(True, "non-finite", f"NaN or Inf in the outputs of {bad} of {n} inputs")
    if n >= 2:
        scale = max(float(np.abs(flat).max()), 1.0)
        if float(np.ptp(flat, axis=0).max()) <= 1e-6 * scale:
            return Verdict(True, "constant", f"the same output for all {n} inputs")
    if boxes is not None:
        with_boxes = sum(1 for b in boxes if b > 0)
        seen = (f"boxes in {with_boxes} of {len(boxes)} inputs "
                f"({sum(boxes)} boxes in all)")
        if len(boxes) < MIN_INPUTS and with_boxes:
            return Verdict(False, "too-few", seen)
        if with_boxes < MIN_BOX_SHARE * len(boxes) or with_boxes == 0:
            return Verdict(True, "no-boxes", seen)
        return Verdict(False, "ok", seen)
    if top1 is not None and top1:
        classes, counts = np.unique(np.asarray(top1), return_counts=True)
        i = int(counts.argmax())
        share = counts[i] / len(top1)
        seen = (f"top-1 class {int(classes[i])} for {int(counts[i])} of {len(top1)} inputs, "
                f"{len(classes)} distinct classes")
        width = flat.shape[1]
        if len(top1) < MIN_INPUTS or width < 2:
            return Verdict(False, "too-few" if len(top1) < MIN_INPUTS else "ok", seen)
        if share >= ONE_CLASS_SHARE:
            return Verdict(True, "one-class", seen)
        return Verdict(False, "ok", seen)
    return Verdict(False, "ok", f"{n} finite, varying outputs")


class FirstFrames:
    """A served model's first `n` frames, judged once when the n-th arrives (`see` returns
    the Verdict then, None before and after). Not thread-safe: the pipeline's result thread
    owns it. Keeps only one row of floats per frame (a digest of the output: its first 4096
    values), so 50 frames cost little."""

    def __init__(self, detector: bool, n: int = FIRST_FRAMES, scene: bool = True):
        """`scene` False: only non-finite and constant outputs count (see module doc)."""
        self._detector, self._n, self._scene = detector, n, scene
        self._rows: list[np.ndarray] = []
        self._counts: list[int] = []
        self.verdict: Verdict | None = None

    def see(self, output: np.ndarray, result: dict) -> Verdict | None:
        """One frame's raw output and its result fields (`boxes` or `label`)."""
        if self.verdict is not None:
            return None
        flat = np.asarray(output, np.float32).reshape(-1)
        self._rows.append(flat[:4096].copy())
        if self._detector:
            self._counts.append(len(result.get("boxes", ())))
        else:
            self._counts.append(int(np.argmax(flat)) if flat.size else 0)
        if len(self._rows) < self._n:
            return None
        width = min(r.size for r in self._rows)
        outs = np.stack([r[:width] for r in self._rows])
        if not self._scene:
            self.verdict = judge(outs)
        elif self._detector:
            self.verdict = judge(outs, boxes=self._counts)
        else:
            self.verdict = judge(outs, top1=self._counts)
        self._rows.clear()
        return self.verdict


class Watch:
    """Every served model's first frames (one FirstFrames per model file), for the pipeline:
    `see` returns a `model_blind` event dict once, when a model's first frames look
    degenerate; `blind` holds what was seen, by model name, for health."""

    def __init__(self, n: int = FIRST_FRAMES):
        self._n = n
        self._by: dict[tuple[str, str], FirstFrames] = {}
        self.blind: dict[str, str] = {}

    def see(self, manifest, output: np.ndarray, result: dict) -> dict | None:
        """One frame of `manifest`'s model (runtime.engine.manifest.Manifest)."""
        key = (manifest.name, str(manifest.root))
        ff = self._by.get(key)
        if ff is None:
            ff = self._by[key] = FirstFrames(manifest.detect is not None, self._n,
                                             scene=not manifest.reference_seen)
            self.blind.pop(manifest.name, None)  # a new file of that name starts afresh
        v = ff.see(output, result)
        if v is None or not v.blind:
            return None
        self.blind[manifest.name] = f"{v.kind}: {v.seen}"
        return {"type": EventType.MODEL_BLIND, "severity": "warning", "model": manifest.name,
                "kind": v.kind, "seen": v.seen, "frames": self._n,
                "preprocess": manifest.preprocess_source,
                "hint": "its outputs over its first frames look degenerate: check the "
                        "preprocessing (`edgerun check` prints it and where it came from)"}
