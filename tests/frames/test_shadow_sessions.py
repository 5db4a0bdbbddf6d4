"""Who closes probation's old sessions (runtime/frames/pipeline.py `begin_shadow`, `add_shadow`,
`drop_shadow`, `stop`; runtime/frames/shadow.py): every one the shadow sample held is closed
once the probation ends, a second deploy replaces it, or the pipeline stops, and never the
session running or about to run. Real ONNX Runtime sessions of the tiny CNN."""

from __future__ import annotations

import numpy as np
import pytest
from support.tiny_ort import closed, tiny_variant

from runtime.engine.tiling import infer_tiles
from runtime.frames.frame import Frame
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.shadow import LOADED_FAILS

FORMS = frozenset({"fp32-r60", "fp32-r56"})


@pytest.fixture
def parts(tmp_path):
    m, backend, v = tiny_variant(tmp_path)

    def session(form: str, shape=None) -> Active:
        return Active(0, f"tiny/{form}@onnxruntime:CPU/t1", backend.load(v),
                      shape or v.model.input_shape, m)

    p = Pipeline(lambda: None, m, lambda _r: [], lambda _e: None)  # never started
    return m, p, session


def test_a_second_deploy_closes_the_first_probations_old_sessions(parts):
    _m, p, session = parts
    running, old_r60, old_r56 = session("fp32-r60"), session("fp32-r60"), session("fp32-r56")
    p.switch(running)
    p.begin_shadow(old_r60, 1, FORMS)
    assert p.add_shadow(old_r56)
    p.begin_shadow(running, 1, FORMS)  # the next version's probation: the running one is old
    assert closed(old_r60) and closed(old_r56) and not closed(running)
    assert p.shadow.sessions() == [running]


def test_the_end_of_a_probation_closes_its_old_sessions_but_the_running_one(parts):
    _m, p, session = parts
    running, old_r56 = session("fp32-r60"), session("fp32-r56")
    p.switch(running)
    p.begin_shadow(running, 1, FORMS)  # the swap not taken yet: the shadow is still running
    assert p.add_shadow(old_r56)
    p.begin_shadow(None)
    assert closed(old_r56) and not closed(running) and p.shadow.sessions() == []
    assert not p.add_shadow(session("fp32-r56"))  # no probation: the caller closes it


def test_stopping_the_pipeline_closes_every_old_session(parts):
    _m, p, session = parts
    old_r60, old_r56 = session("fp32-r60"), session("fp32-r56")
    p.begin_shadow(old_r60, 1, FORMS)
    p.add_shadow(old_r56)
    p.stop(drain_timeout_s=0)
    assert closed(old_r60) and closed(old_r56)


def test_a_loaded_session_that_keeps_failing_is_closed_and_its_form_falls_back(parts):
    """The old version's r56 session refuses every frame (a shape its model does not take):
    after LOADED_FAILS it is dropped and closed, and r56 frames go to the swap's session
    (counted on every form, not like with like); the swap's own failures are not counted."""
    m, p, session = parts
    old_r60 = session("fp32-r60")
    broken = session("fp32-r56", (1, 3, 16, 16))
    new_r56 = session("fp32-r56")
    p.begin_shadow(old_r60, 1, FORMS)
    assert p.add_shadow(broken)
    pre = m.preprocess.apply
    image = np.zeros((32, 32, 3), np.uint8)
    out = infer_tiles(new_r56.session, pre(image, new_r56.input_shape))
    for _ in range(LOADED_FAILS + 2):
        p.shadow.sample(Frame(image, "f"), out, new_r56)
        p.shadow.compare_due(lambda _a: pre, m)
    assert closed(broken) and p.shadow.sessions() == [old_r60]
    assert p.shadow.failed == 0  # the swap's session never failed
    assert p.shadow.counts == [0, 0] and p.shadow.mixed == [2, 2]
    assert p.shadow.other_form == 2
