"""When the served-energy watch (runtime/device/serving_drift.py) reads the running variant's
accelerator meter at all: not for a simulated device, not while the profiler runs, not while
a source's own model shares that accelerator. The meter is faked at the hardware boundary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.choice.selector import Profile
from runtime.device.serving_drift import ServingDrift


class Meter:
    """An accelerator's energy meter (power/nvml.py NvmlMeter's surface), counting reads."""

    where = "gpu0"

    def __init__(self) -> None:
        self.reads = 0

    def covers(self, device: str) -> bool:
        return device.startswith("cuda")

    def resolution(self) -> SimpleNamespace:
        return SimpleNamespace(min_window_s=lambda: 1.0, error=lambda window_s: 0.01)

    def energy_j(self) -> float:
        self.reads += 1
        return 100.0 * self.reads


def _serving(meter: Meter, simulated: bool, busy: bool, shared: bool) -> SimpleNamespace:
    """What ServingDrift.tick reads of runtime.device.serving.Serving: the [model]'s variant
    "g" runs on cuda:0; with `shared`, a source's own model runs there too."""
    g = Profile("g", "m", "fp32", "onnxruntime", "cuda:0", 1, actual_device="cuda:0")
    s = Profile("s", "m2", "fp32", "onnxruntime", "cuda:0", 1, actual_device="cuda:0")
    source = SimpleNamespace(by_id={"s": s}, rungs=[SimpleNamespace(variant_id="s")], current=0)
    return SimpleNamespace(
        simulated=simulated, pipeline=SimpleNamespace(active=SimpleNamespace(variant_id="g")),
        box=SimpleNamespace(model=SimpleNamespace(by_id={"g": g}, gpu_idle_w={"gpu0": 20.0}),
                            source_models={"cam": source} if shared else {}),
        gpu_meters=[meter], profiler=SimpleNamespace(busy=lambda: busy),
        energy=SimpleNamespace(served={}, live={}),
        device=SimpleNamespace(power=SimpleNamespace(active_w_per_core=2.0)))


@pytest.mark.parametrize(("name", "simulated", "busy", "shared", "reads"), [
    ("serving on its accelerator: its meter is read each tick", False, False, False, 2),
    ("a simulated device: its meters are not this host's", True, False, False, 0),
    ("the profiler runs: its work would be billed to the frames", False, True, False, 0),
    ("a source's model on the same accelerator: its energy would be billed to the frames",
     False, False, True, 0),
], ids=lambda v: v if isinstance(v, str) else None)
def test_when_the_accelerator_s_meter_is_read(name, simulated, busy, shared, reads):
    meter = Meter()
    d = _serving(meter, simulated, busy, shared)
    watch = ServingDrift(clock=iter([0.0, 0.5]).__next__)  # a window too short for a figure
    watch.tick(d)
    watch.tick(d)
    assert meter.reads == reads and watch.figure is None
