"""Probation's shadow sample (runtime/frames/shadow.py): which frames of the new model are
compared with the old one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from runtime.engine.tiling import infer_tiles
from runtime.frames.frame import Frame
from runtime.frames.shadow import ShadowSample, form


@dataclass(eq=False)
class _Active:
    variant_id: str
    session: Any = None
    input_shape: tuple[int, ...] = (1, 3, 8, 8)
    manifest: Any = None


@pytest.mark.parametrize("vid, want", [
    ("inspection/fp32-r60@onnxruntime:CPU/t1,opt=all", "fp32-r60"),
    ("inspection/int8@openvino:CPU/t1", "int8"),
    ("slow/fp32@opencv:CPU/tdefault", "fp32"),
    ("no-slash", ""),
])
def test_a_variants_form_is_its_math_without_model_or_engine(vid, want):
    assert form(vid) == want


def _run(old: _Active | None, forms: frozenset[str], ran: list[_Active], every: int = 1
         ) -> ShadowSample:
    s = ShadowSample()
    s.begin(old, every, forms)
    frame = Frame(np.zeros((4, 4, 3), np.uint8), "f1")
    for a in ran:
        s.sample(frame, None, a)
    return s


OLD = _Active("inspection/fp32-r60@onnxruntime:CPU/t1")
R60 = _Active("inspection/fp32-r60@onnxruntime:CPU/t1")  # the new version, same form
R56 = _Active("inspection/fp32-r56@onnxruntime:CPU/t1")
OTHER = _Active("detector/fp32@onnxruntime:CPU/t1")
OLD_FP32 = _Active("inspection/fp32@onnxruntime:CPU/t1")
NEW_FORMS = frozenset({"fp32-r60", "fp32-r56", "int8"})


@pytest.mark.parametrize("old, forms, ran, due, other", [
    # a new version with the old form: its frames on that form are compared like with like,
    # the others kept apart (judged only if the like-with-like sample cannot fill)
    (OLD, NEW_FORMS, [R60, R56, R56, R60], (2, 2), 2),
    (OLD, NEW_FORMS, [R56] * 5, (0, 5), 5),
    # a model without the old form: every form is like with like
    (OLD, frozenset({"fp32"}), [OTHER, OTHER, OTHER], (3, 0), 0),
    # another network with a form of the old one's name: compared on that form
    (OLD_FP32, frozenset({"fp32", "int8"}), [OTHER, R60, OTHER], (2, 1), 1),
    # frames the old session itself still infers (the swap not yet taken): never sampled
    (OLD, NEW_FORMS, [OLD, OLD, R60], (1, 0), 0),
    (None, NEW_FORMS, [R60, R56], (0, 0), 0),  # no probation
])
def test_the_new_model_is_compared_on_the_old_models_form(old, forms, ran, due, other):
    s = _run(old, forms, ran)
    assert s.due == due and s.other_form == other


def test_every_nth_counts_frames_of_each_kind_apart():
    s = _run(OLD, NEW_FORMS, [R60, R56, R60, R56, R60, R56, R60], every=2)
    assert s.due == (2, 1) and s.other_form == 3  # the 2nd and 4th R60, the 2nd R56


def test_comparisons_count_like_with_like_apart_from_every_form(tmp_path):
    """A real session (the tiny CNN on ONNX Runtime) as both models: every comparison agrees;
    those of the old form count in `counts` and `mixed`, the others in `mixed` alone."""
    from support.tiny_ort import tiny_variant

    from runtime.frames.pipeline import Active as PipeActive

    m, backend, v = tiny_variant(tmp_path)
    session = backend.load(v)

    def active(vid: str) -> PipeActive:
        return PipeActive(0, vid, session, v.model.input_shape)

    s = ShadowSample()
    s.begin(active("tiny/fp32-r60@ort"), 1, frozenset({"fp32-r60", "fp32-r56"}))
    r60, r56 = active("tiny/fp32-r60@ort"), active("tiny/fp32-r56@ort")
    rng = np.random.default_rng(0)
    pre = m.preprocess.apply
    for a in (r60, r56, r56, r60, r56):
        image = rng.integers(0, 255, (32, 32, 3), np.uint8)
        out = infer_tiles(session, pre(image, v.model.input_shape))
        s.sample(Frame(image, "f"), out, a)
    s.compare_due(lambda _a: pre, m)
    assert s.counts == [2, 2] and s.mixed == [5, 5] and s.due == (0, 0)


OLD_R56 = _Active("inspection/fp32-r56@onnxruntime:CPU/t1")  # the old version's, loaded later


def test_a_form_without_an_old_session_is_wanted_until_one_is_added():
    s = _run(OLD, NEW_FORMS, [R56, R56])
    assert s.due == (0, 2) and s.wanted == {"fp32-r56": R56.variant_id}
    s.add(OLD_R56)
    assert s.wanted == {} and s.sessions() == [OLD, OLD_R56]
    for a in (R56, R60, OLD_R56):  # the added session itself is never a new frame
        s.sample(Frame(np.zeros((4, 4, 3), np.uint8), "f1"), None, a)
    assert s.due == (2, 2) and s.other_form == 2


def test_no_session_is_added_where_the_new_model_lacks_the_old_form():
    s = _run(OLD, frozenset({"fp32"}), [OTHER])  # every form is compared with the swap's
    s.add(OLD_R56)
    assert s.sessions() == [OLD] and s.wanted == {} and s.due == (1, 0)


def test_the_end_of_a_probation_holds_no_session_and_samples_nothing():
    s = _run(OLD, NEW_FORMS, [R56])
    assert s.add(OLD_R56) and not s.add(OLD_R56)  # one session a form
    s.begin(None, 5)
    s.sample(Frame(np.zeros((4, 4, 3), np.uint8), "f1"), None, R56)
    assert s.sessions() == [] and s.due == (0, 0) and s.wanted == {}
    assert not s.add(OLD_R56)  # no probation takes it


def test_each_form_is_compared_with_the_old_versions_session_of_that_form(tmp_path):
    """Two different networks as the old version's r60 and r56 sessions; the new version
    runs the r56 network on r56: compared with the old r56 it agrees on every frame, which
    comparing it with the swap's r60 session would not (checked: the two disagree)."""
    from support.modelgen import tiny_cnn
    from support.tiny_ort import BACKENDS, tiny_variant

    from runtime.engine.manifest import load_model, model_files
    from runtime.frames.pipeline import Active as PipeActive

    m, backend, v = tiny_variant(tmp_path)
    (tmp_path / "b").mkdir()
    mb = load_model(tiny_cnn(tmp_path / "b" / "tiny.onnx", hw=(32, 32), seed=7))
    vb = backend.variants(model_files(mb)[0], BACKENDS, (1,))[0]
    net_a, net_b = backend.load(v), backend.load(vb)
    shape = v.model.input_shape
    old_r60 = PipeActive(0, "tiny/fp32-r60@ort", net_a, shape)
    old_r56 = PipeActive(1, "tiny/fp32-r56@ort", net_b, shape)
    new_r56 = PipeActive(1, "tiny/fp32-r56@ort", backend.load(vb), shape)
    s = ShadowSample()
    s.begin(old_r60, 1, frozenset({"fp32-r60", "fp32-r56"}))
    s.add(old_r56)
    rng = np.random.default_rng(0)
    pre = m.preprocess.apply
    images = [rng.integers(0, 255, (32, 32, 3), np.uint8) for _ in range(12)]
    labels = {}
    for name, net in (("a", net_a), ("b", net_b)):
        labels[name] = [int(np.argmax(infer_tiles(net, pre(i, shape))[0])) for i in images]
    assert labels["a"] != labels["b"]  # the positive control: r60 vs r56 would disagree
    for image in images:
        s.sample(Frame(image, "f"), infer_tiles(new_r56.session, pre(image, shape)), new_r56)
    s.compare_due(lambda _a: pre, m)
    assert s.counts == [12, 12] and s.mixed == [12, 12]


def test_an_old_session_that_raises_costs_the_comparison_and_is_counted(tmp_path):
    """The old model's session given a shape it refuses (a real ONNX Runtime error): each
    comparison due is lost and counted, with the error, and nothing is compared."""
    from support.tiny_ort import tiny_variant

    from runtime.frames.pipeline import Active as PipeActive

    m, backend, v = tiny_variant(tmp_path)
    session = backend.load(v)
    old = PipeActive(0, "tiny/fp32-r60@ort", session, (1, 3, 16, 16))  # not the model's
    new = PipeActive(0, "tiny/fp32-r60@ort", backend.load(v), v.model.input_shape)
    s = ShadowSample()
    s.begin(old, 1, frozenset({"fp32-r60"}))
    image = np.zeros((32, 32, 3), np.uint8)
    pre = m.preprocess.apply
    for _ in range(3):
        s.sample(Frame(image, "f"), infer_tiles(new.session, pre(image, new.input_shape)), new)
    s.compare_due(lambda _a: pre, m)
    assert s.failed == 3 and s.counts == [0, 0] and s.mixed == [0, 0] and s.last_error
