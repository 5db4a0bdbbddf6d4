"""The preprocessing chooser (runtime/engine/preprocessing.py): the cheaper measured path, or
the path the box choice pinned for a variant, and the CPU path when a pinned one cannot run.
Paths are fakes whose energy is exact, so the tables need no OpenCL device."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from runtime.engine.preprocessing import BY_BOX, CHEAPEST, PreprocessChooser

SHAPE = (1, 3, 8, 8)
FRAME = np.zeros((20, 30, 3), np.uint8)
LABEL = "30x20->8x8"


class Meter:
    """Energy that only the fake paths spend (J), nothing for idle."""

    def __init__(self) -> None:
        self.j = 0.0

    def energy_j(self) -> float:
        return self.j


class Cpu:
    """A stand-in for runtime.engine.manifest.Preprocess: a tensor of zeros, `cost_j` each."""

    def __init__(self, meter: Meter, cost_j: float):
        self.meter, self.cost_j = meter, cost_j

    def apply(self, frame: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        self.meter.j += self.cost_j
        return np.zeros(shape, np.float32)


def chooser(cpu_j: float, ocl_j: float, ocl: str = "ok") -> tuple[PreprocessChooser, dict]:
    """A chooser over the fake CPU path and an OpenCL one returning ones: `ocl` ok, absent
    (its factory raises) or breaks (fails once `state["broken"]` is set, after measuring)."""
    meter, state = Meter(), {"broken": False}

    def make(shape):
        if ocl == "absent":
            raise RuntimeError("no OpenCL device")

        def run(frame):
            if state["broken"]:
                raise RuntimeError("CL_OUT_OF_RESOURCES")
            meter.j += ocl_j
            return np.ones(shape, np.float32)
        return run

    return PreprocessChooser(Cpu(meter, cpu_j), meter, 0.0, make, "opencl:0"), state


CASES = [
    # (name, cpu J, opencl J, opencl, pin, path used, why)
    ("no pin: the cheaper measured path", 2e-3, 1e-3, "ok", "", "opencl:0", CHEAPEST),
    ("no pin: the CPU when it is cheaper", 1e-3, 2e-3, "ok", "", "cpu", CHEAPEST),
    ("pinned to the CPU while OpenCL measures cheaper", 2e-3, 1e-3, "ok", "cpu", "cpu", BY_BOX),
    ("pinned to OpenCL while the CPU measures cheaper", 1e-3, 2e-3, "ok", "opencl:0",
     "opencl:0", BY_BOX),
    ("pinned to an OpenCL this host lacks: the CPU", 2e-3, 1e-3, "absent", "opencl:0", "cpu",
     "is not available"),
    ("pinned to another device's OpenCL: the CPU", 2e-3, 1e-3, "ok", "opencl:1", "cpu",
     "is not available"),
]


@pytest.mark.parametrize("name,cpu_j,ocl_j,ocl,pin,used,why", CASES, ids=[c[0] for c in CASES])
def test_the_path_used_and_why(name, cpu_j, ocl_j, ocl, pin, used, why, caplog):
    ch, _ = chooser(cpu_j, ocl_j, ocl)
    with caplog.at_level(logging.WARNING, "edgerun.preprocess"):
        out = [ch(FRAME, SHAPE, pin) for _ in range(3)]
    assert all(o.max() == (1.0 if used.startswith("opencl") else 0.0) for o in out)
    rows = ch.report[LABEL]
    (chosen,) = [r for r in rows if r["chosen"]]
    assert chosen["path"] == used and why in chosen["why"]
    # measured for the report whatever is pinned: both paths when OpenCL is there
    assert {r["path"] for r in rows} == ({"cpu"} if ocl == "absent" else {"cpu", "opencl:0"})
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == (1 if "not available" in why else 0)  # said once, not per frame


def test_a_pinned_path_that_fails_on_a_frame_gives_way_to_the_cpu(caplog):
    ch, state = chooser(2e-3, 1e-3)
    assert ch(FRAME, SHAPE, "opencl:0").max() == 1.0
    state["broken"] = True
    with caplog.at_level(logging.WARNING, "edgerun.preprocess"):
        out = [ch(FRAME, SHAPE, "opencl:0") for _ in range(3)]
        (chosen,) = [r for r in ch.report[LABEL] if r["chosen"]]
        unpinned = ch(FRAME, SHAPE)  # nor does the chooser's own ranking take it again
    assert all(o.max() == 0.0 for o in out) and unpinned.max() == 0.0  # no frame lost
    assert chosen["path"] == "cpu" and "failed on a frame" in chosen["why"]
    failed = [r for r in caplog.records if "failed on a" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]


def test_each_variant_on_its_pin_and_a_new_pin_applies_without_a_new_session():
    ch, _ = chooser(2e-3, 1e-3)
    ch.pin({"a": "cpu", "b": "opencl:0"})
    a, b, c = ch.for_variant("a"), ch.for_variant("b"), ch.for_variant("c")
    assert ch.for_variant("a") is a  # one view per variant: the pipeline caches by it
    assert a(FRAME, SHAPE).max() == 0.0 and b(FRAME, SHAPE).max() == 1.0
    assert c(FRAME, SHAPE).max() == 1.0  # not pinned: the cheaper
    (chosen,) = [r for r in ch.report[LABEL] if r["chosen"]]
    assert chosen["why"] == CHEAPEST  # the report says what the last frame used
    ch.pin({"a": "opencl:0"})  # a rebuilt ladder: the running session follows at once
    assert a(FRAME, SHAPE).max() == 1.0
    (chosen,) = [r for r in ch.report[LABEL] if r["chosen"]]
    assert (chosen["path"], chosen["why"]) == ("opencl:0", BY_BOX)
