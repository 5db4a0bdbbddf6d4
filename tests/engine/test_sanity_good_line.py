"""A healthy inspection model on a good line is not blind (runtime/engine/sanity.py). Found by
an outside run (2026-12-07): `edgerun serve` of the bundled inspection model on the synthetic
line raised model_blind ("top-1 class 0 for 48 of 50 inputs, 2 distinct classes") on a model
right on 49 of those 50 (47 were good parts by the source's truth); a line with 2 % defects
would raise it at every start and swap."""

from __future__ import annotations

import dataclasses

import numpy as np

from models import bundled
from runtime.engine.manifest import load_manifest
from runtime.engine.sanity import Watch


def _frames(top1: list[int], seed: int = 7) -> list[np.ndarray]:
    """Softmax outputs whose top-1 is each of `top1`, confident but varying."""
    rng = np.random.default_rng(seed)
    out = []
    for cls in top1:
        logits = rng.standard_normal(5)
        logits[cls] += 4.0
        out.append((np.exp(logits) / np.exp(logits).sum()).astype(np.float32))
    return out


def _events(manifest, frames: list[np.ndarray]) -> list[dict]:
    w = Watch()
    return [ev for f in frames if (ev := w.see(manifest, f, {})) is not None]


def test_a_mostly_ok_line_does_not_make_a_prepared_model_blind():
    m = load_manifest(bundled())
    assert m.reference_seen  # `models prepare` saw its reference see 5 classes
    assert _events(m, _frames([0] * 48 + [2, 4])) == []
    assert _events(m, _frames([0] * 50)) == []  # a line without a defect in 50 parts


def test_what_no_scene_explains_still_makes_it_blind():
    m = load_manifest(bundled())
    nan = [np.full(5, np.nan, np.float32)] * 50
    (ev,) = _events(m, nan)
    assert ev["kind"] == "non-finite"
    (ev,) = _events(m, [np.array([0.9, 0.05, 0.03, 0.01, 0.01], np.float32)] * 50)
    assert ev["kind"] == "constant"


def test_a_model_without_that_evidence_is_judged_on_its_classes_too():
    m = dataclasses.replace(load_manifest(bundled()), reference_seen=False)
    (ev,) = _events(m, _frames([0] * 50))
    assert ev["kind"] == "one-class"
