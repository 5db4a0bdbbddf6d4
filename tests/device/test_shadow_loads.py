"""OTA probation's old sessions of other forms (runtime/device/shadow_loads.py): loaded from the
old version's measurement when the new version runs on a form the shadow has no session of,
handed over between frames, bounded, and closed when their probation has ended."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
from support.tiny_ort import closed

from runtime.choice.measure import Measured
from runtime.device.served_model import old_session
from runtime.device.shadow_loads import MAX_FORMS, ShadowLoads
from runtime.frames.frame import Frame
from runtime.frames.pipeline import Active, Pipeline


def _pipeline(m: Any) -> Pipeline:
    return Pipeline(lambda: None, m, lambda _r: [], lambda _e: None)  # never started


def _old_version(tmp_path, forms: list[str]) -> tuple[Measured, Any]:
    """The old version's measurement: one variant of the tiny CNN per form."""
    from support.tiny_ort import tiny_variant

    m, backend, v = tiny_variant(tmp_path)
    loaders = {f"tiny/{f}@onnxruntime:CPU/t1": (backend, v) for f in forms}
    return Measured(m, [], 0.0, loaders, None), v


def _probation(p: Pipeline, prev: Measured, v: Any, ran: list[str]) -> None:
    swap = Active(0, "tiny/fp32-r60@onnxruntime:CPU/t1", prev.loaders[
        "tiny/fp32-r60@onnxruntime:CPU/t1"][0].load(v), v.model.input_shape)
    p.begin_shadow(swap, 1, frozenset({"fp32-r60", "fp32-r56", "int8", "a", "b", "c", "d"}))
    for f in ran:
        p.shadow.sample(Frame(np.zeros((32, 32, 3), np.uint8), "f"), None,
                        Active(0, f"tiny/{f}@onnxruntime:CPU/t1", None, v.model.input_shape))


def _tick_until(loads: ShadowLoads, p: Pipeline, prev: Measured, done, open_: bool = True
                ) -> None:
    deadline = time.monotonic() + 60  # a load on a busy box; the condition ends it
    while not done():
        assert time.monotonic() < deadline, "the old session was never handed over"
        loads.tick(p, prev, open_)
        time.sleep(0.01)


def test_the_old_versions_session_of_a_wanted_form_is_loaded_and_compared(tmp_path):
    prev, v = _old_version(tmp_path, ["fp32-r60", "fp32-r56"])
    p, loads = _pipeline(prev.manifest), ShadowLoads()
    loads.reset()
    _probation(p, prev, v, ["fp32-r56"])
    assert p.shadow.wanted == {"fp32-r56": "tiny/fp32-r56@onnxruntime:CPU/t1"}
    _tick_until(loads, p, prev, lambda: len(p.shadow.sessions()) == 2)
    old = p.shadow.sessions()[1]
    assert old.variant_id == "tiny/fp32-r56@onnxruntime:CPU/t1" and old.manifest is prev.manifest
    assert p.shadow.wanted == {}
    p.shadow.sample(Frame(np.zeros((32, 32, 3), np.uint8), "f"), None,
                    Active(0, "tiny/fp32-r56@onnxruntime:CPU/t1", None, v.model.input_shape))
    assert p.shadow.due == (1, 1)  # now like with like; the frame before it was not


def test_a_form_the_old_version_lacks_is_said_and_not_asked_again(tmp_path, caplog):
    prev, v = _old_version(tmp_path, ["fp32-r60"])
    p, loads = _pipeline(prev.manifest), ShadowLoads()
    loads.reset()
    _probation(p, prev, v, ["int8"])
    with caplog.at_level(logging.INFO, "edgerun.ota"):
        _tick_until(loads, p, prev, lambda: "has no int8 variant" in caplog.text)
        for _ in range(3):
            loads.tick(p, prev, True)
    assert caplog.text.count("has no int8 variant") == 1 and len(p.shadow.sessions()) == 1


def test_a_probation_loads_at_most_max_forms(tmp_path, caplog):
    forms = ["a", "b", "c", "d"]
    assert len(forms) > MAX_FORMS
    prev, v = _old_version(tmp_path, ["fp32-r60", *forms])
    p, loads = _pipeline(prev.manifest), ShadowLoads()
    loads.reset()
    _probation(p, prev, v, forms)
    with caplog.at_level(logging.INFO, "edgerun.ota"):
        _tick_until(loads, p, prev, lambda: len(p.shadow.sessions()) == 1 + MAX_FORMS)
        for _ in range(20):
            loads.tick(p, prev, True)
            time.sleep(0.01)
    assert len(p.shadow.sessions()) == 1 + MAX_FORMS
    assert "no old session of d" in caplog.text


@pytest.fixture
def made(monkeypatch) -> list[Active]:
    """Every old session a load made (the real loader, watched)."""
    from runtime.device import shadow_loads

    out: list[Active] = []

    def watched(*args: Any) -> Active | None:
        a = old_session(*args)
        if a is not None:
            out.append(a)
        return a

    monkeypatch.setattr(shadow_loads, "old_session", watched)
    return out


@pytest.mark.parametrize("how", ["ended", "a new probation"])
def test_a_session_loaded_after_its_probation_is_closed(tmp_path, how, made):
    prev, v = _old_version(tmp_path, ["fp32-r60", "fp32-r56"])
    p, loads = _pipeline(prev.manifest), ShadowLoads()
    loads.reset()
    _probation(p, prev, v, ["fp32-r56"])
    loads.tick(p, prev, True)  # the load starts
    if how == "ended":
        p.begin_shadow(None)
        still_open = False
    else:
        loads.reset()  # a new probation, whose shadow has only its swap's session yet
        _probation(p, prev, v, [])
        still_open = True
    deadline = time.monotonic() + 60
    while loads.busy():
        assert time.monotonic() < deadline
        loads.tick(p, prev, still_open)
        time.sleep(0.01)
    assert len(made) == 1 and closed(made[0])
    assert len(p.shadow.sessions()) == (1 if how != "ended" else 0)


def test_the_daemons_stop_waits_for_a_load_and_closes_it(tmp_path, made):
    prev, v = _old_version(tmp_path, ["fp32-r60", "fp32-r56"])
    p, loads = _pipeline(prev.manifest), ShadowLoads()
    loads.reset()
    _probation(p, prev, v, ["fp32-r56"])
    loads.tick(p, prev, True)  # the load starts
    loads.close()
    assert not loads.busy() and len(made) == 1 and closed(made[0])
    assert len(p.shadow.sessions()) == 1  # never handed over
    loads.tick(p, prev, True)
    assert not loads.busy() and len(made) == 1  # closed: no new load


def test_a_session_whose_warm_up_fails_is_closed_and_the_error_raised(tmp_path):
    from support.tiny_ort import tiny_variant

    from runtime.device.served_model import warmed

    m, backend, v = tiny_variant(tmp_path)
    session = backend.load(v)
    with pytest.raises(Exception):  # noqa: B017 -- whatever ONNX Runtime raises for the shape
        warmed(session, m.preprocess, (1, 3, 16, 16))  # a shape the model does not take
    assert closed(Active(0, v.id, session, v.model.input_shape))
    ok = backend.load(v)
    assert warmed(ok, m.preprocess, v.model.input_shape) is ok
    assert not closed(Active(0, v.id, ok, v.model.input_shape))
