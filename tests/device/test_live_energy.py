"""Live energy per inference, learnt from the traffic served (runtime/device/live_energy.py):
when a figure is made, what it is billed, how it folds into the last one."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from runtime.choice.selector import Profile
from runtime.device import live_energy
from runtime.device.live_energy import LiveEnergy, fold

# 6 mJ for 1 ms of CPU per inference: 6 J per CPU-second
V = Profile("v", "m", "fp32", "onnxruntime", "CPU", 1, energy_mj=6.0, cpu_ms=1.0)
W = replace(V, variant_id="w")
GPU = replace(V, actual_device="opencl:0 (NVIDIA CUDA: NVIDIA H200)")

FOLDS = [
    # name, taken {id: (inferences, CPU s)}, profiles, live after, acc after (the basic fold,
    # its EWMA and the native threads' billing: tests/device/test_device_parts.py)
    ("a profile that measured no energy: the default joules per CPU-second",
     {"v": (50, 0.05)}, {"v": replace(V, energy_mj=0.0)}, {"v": 0.002}, {}),
    ("a profile without CPU time: the default", {"v": (50, 0.05)},
     {"v": replace(V, cpu_ms=math.nan)}, {"v": 0.002}, {}),
    ("a variant on an accelerator: not learnt from host CPU", {"v": (50, 0.05)}, {"v": GPU},
     {}, {}),
    ("a variant without a profile: kept accumulating", {"x": (60, 0.06)}, {}, {},
     {"x": (60, 0.06)}),
]


@pytest.mark.parametrize(("name", "taken", "profiles", "live", "acc"), FOLDS,
                         ids=[c[0] for c in FOLDS])
def test_fold(name, taken, profiles, live, acc):
    got_acc, got_live = {}, {}
    fold(got_acc, got_live, taken, profiles, "v", 0.0, lambda: 2.0)
    assert got_live == pytest.approx(live) and got_acc == acc


def _live(monkeypatch, native: list[float]) -> LiveEnergy:
    """A LiveEnergy whose process's native threads read `native` in turn (CPU s)."""
    monkeypatch.setattr(live_energy, "native_threads_cpu_s", lambda: native.pop(0))
    return LiveEnergy()


def test_native_cpu_going_back_bills_nothing(monkeypatch):
    """A native thread that ended takes its CPU time with it: the total falls, and nothing
    (not a negative figure) is billed."""
    e = _live(monkeypatch, [1.0, 0.5])
    pool = replace(V, threads=2)
    e.update(lambda: {}, "v", pool, {"v": pool}, False, lambda: 2.0)
    e.update(lambda: {"v": (50, 0.05)}, "v", pool, {"v": pool}, False, lambda: 2.0)
    assert e.live == pytest.approx({"v": 0.006})


def test_while_profiling_the_served_cpu_is_taken_and_not_learnt(monkeypatch):
    """The profiler's work would be billed to the running variant: what was served meanwhile
    is taken (so it is not billed later either) and dropped."""
    e = _live(monkeypatch, [0.0, 0.0])
    taken = []

    def take():
        taken.append(1)
        return {"v": (50, 0.05)}

    assert e.update(take, "v", V, {"v": V}, True, lambda: 2.0) is False
    assert taken == [1] and e.live == {} and e.acc == {} and e.served == {}
    assert e.update(lambda: {"v": (50, 0.05)}, "v", V, {"v": V}, False, lambda: 2.0)
    assert e.served == {"v": (50, 0.05)} and e.live == pytest.approx({"v": 0.006})


def test_a_new_measurement_of_the_model_forgets_its_figures_only():
    """The [model]'s live ids have no key; a source's own model's ("key\\x00id") are kept."""
    e = LiveEnergy()
    e.live = {"v": 1.0, "cam\x00d": 2.0}
    e.acc = {"v": (3, 0.1), "cam\x00d": (4, 0.2)}
    e.forget_model()
    assert (e.live, e.acc) == ({"cam\x00d": 2.0}, {"cam\x00d": (4, 0.2)})
