"""Accelerator variants are billed what the accelerator draws (power/accelerators.py), by NVML
where it covers the GPU (power/nvml.py), never as free. NVML is faked at the true hardware
boundary (the `pynvml` module); the engines, the profiler and the selector are the real ones.
"""

from __future__ import annotations

import sys

import pytest
from support.modelgen import tiny_cnn

from power import nvml as nvml_mod
from power.accelerators import AcceleratorPower, bill, find, on_host
from power.sensors import EstimatedMeter, SensorError
from runtime.choice.profiler import Profiler, model_files, profile_all
from runtime.choice.selector import Constraints, select
from runtime.config import BackendsConfig, ModelConfig
from runtime.device.profiles import load_profile
from runtime.engine.backends.onnxruntime import OnnxRuntimeBackend

L4 = AcceleratorPower("NVIDIA", "GPU", idle_w=16.0, active_w=72.0, basis="cited")


@pytest.mark.parametrize("device, host", [
    ("CPU", True), ("cpu.0 (Portable Computing Language: cpu-haswell)", True),
    ("CUDA", False), ("TensorRT", False), ("GPU.0", False), ("NPU", False),
    ("GPU.0 (NVIDIA CUDA: NVIDIA L4)", False), ("OpenCL", False),
])
def test_which_devices_are_the_host(device, host):
    assert on_host(device) is host


@pytest.mark.parametrize("device, found", [
    ("GPU.0 (NVIDIA CUDA: NVIDIA L4)", L4), ("gpu.0 (nvidia cuda: nvidia l4)", L4),
    ("GPU.0 (Intel(R) OpenCL Graphics: Iris Xe)", None), ("NPU", None),
])
def test_accelerators_are_found_by_what_the_session_reports(device, found):
    assert find((L4,), device) == found


@pytest.mark.parametrize("kw, energy, source, accel", [
    # on the host the host share is the bill
    (dict(actual_device="CPU"), 2.0, "estimated", None),
    # on a described accelerator: busy 0.1 s over 10 inferences x 56 W dynamic = 560 mJ each
    (dict(actual_device="GPU.0 (NVIDIA CUDA: NVIDIA L4)", accelerators=(L4,)), 562.0,
     "estimated", 560.0),
    # a real host meter stays named
    (dict(actual_device="GPU.0 (NVIDIA CUDA: NVIDIA L4)", accelerators=(L4,),
          host_source="rapl"), 562.0, "rapl+estimated", 560.0),
    # a meter covering it: 3 J over 0.1 s with a 20 W idle floor = 1 J above idle, 100 mJ each
    (dict(actual_device="CUDA", metered_j=3.0, meter_idle_w=20.0), 102.0, "estimated+nvml",
     100.0),
    # a meter reading below its idle floor (noise) is no negative energy
    (dict(actual_device="CUDA", metered_j=1.0, meter_idle_w=20.0), 2.0, "estimated+nvml", 0.0),
    # neither a meter nor a description: unknown, never free
    (dict(actual_device="NPU"), None, "estimated", None),
])
def test_the_bill(kw, energy, source, accel):
    args = dict(n=10, host_mj_total=20.0, host_source="estimated", busy_s=0.1, wall_s=0.1) | kw
    b = bill(**args)
    assert b.energy_mj == (pytest.approx(energy) if energy is not None else None)
    assert b.source == source and b.host_mj == pytest.approx(2.0)
    assert b.accel_mj == (pytest.approx(accel) if accel is not None else None)
    assert (b.reason != "") is (energy is None)
    if energy is None:
        assert "NPU" in b.reason and "[[accelerators]]" in b.reason


def test_a_profile_describes_its_accelerators_and_bad_ones_are_refused(tmp_path):
    gpu = load_profile("x86-nvidia-gpu")
    assert gpu.accelerators == (AcceleratorPower("NVIDIA", "GPU", 16.0, 72.0, "cited"),)
    assert load_profile("generic-x86").accelerators == ()
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\ndescription = "b"\n[power]\nidle_w = 5.0\n'
                   'active_w_per_core = 1.0\n[[accelerators]]\nmatch = "X"\nidle_w = 50.0\n'
                   'active_w = 10.0\n')
    with pytest.raises(Exception, match="active_w"):
        load_profile(str(bad))


# -- NVML, faked at the module boundary ------------------------------------------------------

class FakeNvml:
    """The parts of `pynvml` the meter calls: GPUs with an energy counter (mJ) or only a power
    reading (mW), and an error type."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus, init_error=None):
        self.gpus = gpus  # [{"name": ..., "mj": int | None, "mw": int, "broken": bool}]
        self.init_error = init_error

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].get("broken"):
            raise self.NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"].encode()  # older bindings return bytes

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.gpus[h]["mj"] is None:
            raise self.NVMLError("Not Supported")
        return self.gpus[h]["mj"]

    def nvmlDeviceGetPowerUsage(self, h):
        if self.gpus[h].get("gone"):
            raise self.NVMLError("Unknown Error")
        return self.gpus[h]["mw"]


def test_nvml_counter_and_integrated_power():
    fake = FakeNvml([{"name": "NVIDIA L4", "mj": 5_000, "mw": 0},
                     {"name": "Tesla P4", "mj": None, "mw": 30_000}])
    clock = [0.0]
    meters = nvml_mod.gpu_meters(fake)
    counter, old = meters
    assert counter.where == "GPU 0 (NVIDIA L4): total energy counter (mJ)"
    assert counter.energy_j() == 5.0 and not counter.needs_samples
    fake.gpus[0]["mj"] = 6_500
    assert counter.energy_j() == 6.5
    # the integrating meter, on a clock we control
    old = nvml_mod.NvmlMeter(fake, 1, clock=lambda: clock[0])
    assert old.needs_samples and "integrated" in old.where
    clock[0] = 2.0
    assert old.energy_j() == pytest.approx(60.0)  # 30 W for 2 s
    fake.gpus[1]["gone"] = True
    with pytest.raises(SensorError, match="Tesla P4"):
        old.energy_j()


def test_no_library_no_driver_no_gpu_is_no_meter_in_one_line(monkeypatch, caplog):
    caplog.set_level("INFO", logger="power.nvml")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    assert nvml_mod.gpu_meters() == []
    assert nvml_mod.gpu_meters(FakeNvml([], init_error="Driver Not Loaded")) == []
    assert nvml_mod.gpu_meters(FakeNvml([])) == []
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["no GPU meter: NVML's Python binding (nvidia-ml-py) is not installed",
                     "no GPU meter: NVML did not start (Driver Not Loaded)",
                     "no GPU meter: NVML reports no GPU"]
    # one broken GPU costs its own meter only
    two = nvml_mod.gpu_meters(FakeNvml([{"name": "A", "mj": 1, "mw": 0, "broken": True},
                                        {"name": "NVIDIA L4", "mj": 1, "mw": 0}]))
    assert [m.name for m in two] == ["NVIDIA L4"]


def test_a_sessions_gpu_meter_by_name_or_the_only_one():
    one = nvml_mod.gpu_meters(FakeNvml([{"name": "NVIDIA L4", "mj": 1, "mw": 0}]))
    assert nvml_mod.meter_for(one, "GPU.0 (NVIDIA CUDA: NVIDIA L4)") is one[0]
    assert nvml_mod.meter_for(one, "CUDA") is one[0]  # ORT names no GPU: the box has one
    assert nvml_mod.meter_for(one, "GPU.0 (Intel(R) Graphics: Iris Xe)") is None
    two = nvml_mod.gpu_meters(FakeNvml([{"name": "NVIDIA L4", "mj": 1, "mw": 0},
                                        {"name": "NVIDIA A2", "mj": 1, "mw": 0}]))
    assert nvml_mod.meter_for(two, "CUDA") is None  # which one is not known: no guess
    assert nvml_mod.meter_for(two, "GPU.1 (NVIDIA CUDA: NVIDIA A2)") is two[1]


# -- the profiler and the selector on a "GPU" session ----------------------------------------

class GpuSession:
    """ORT on this CPU, reporting a GPU (the accelerator is the hardware boundary); each run
    adds `mj_per_run` to the fake GPU's counter, as a busy GPU would."""

    def __init__(self, inner, fake: FakeNvml | None, mj_per_run: int):
        self._inner, self._fake, self._mj = inner, fake, mj_per_run
        self.actual_device = "GPU.0 (NVIDIA CUDA: NVIDIA L4)"

    def infer(self, batch):
        if self._fake is not None:
            self._fake.gpus[0]["mj"] += self._mj
        return self._inner.infer(batch)

    def close(self):
        self._inner.close()


class GpuBackend(OnnxRuntimeBackend):
    name = "fakegpu"

    def __init__(self, fake=None, mj_per_run=0):
        self._fake, self._mj = fake, mj_per_run

    def load(self, variant):
        return GpuSession(super().load(variant), self._fake, self._mj)


def _profile(tmp_path, cfg, backends, **kw):
    model = tiny_cnn(tmp_path / "m.onnx")
    profiler = Profiler(cfg, EstimatedMeter(5.0, 2.0), "test-device", **kw)
    bcfg = BackendsConfig(threads=(1,))
    return profile_all(backends, model_files(ModelConfig(path=str(model))), (1,), bcfg,
                       profiler, fresh=True)


def test_an_undescribed_accelerator_is_left_out_with_its_reason(tmp_path, fast_profiler_cfg):
    profiles = _profile(tmp_path, fast_profiler_cfg, [OnnxRuntimeBackend(), GpuBackend()])
    gpu = [p for p in profiles if p.engine == "fakegpu"]
    assert gpu and all(not p.ok and "energy is unknown" in p.error for p in gpu)
    choice = select(profiles, Constraints(latency_ms=1000.0))
    assert choice.profile.engine == "onnxruntime"  # never the free-looking GPU


def test_a_described_accelerator_is_billed_its_busy_power(tmp_path, fast_profiler_cfg):
    profiles = _profile(tmp_path, fast_profiler_cfg, [OnnxRuntimeBackend(), GpuBackend()],
                        accelerators=(L4,))
    cpu = min((p for p in profiles if p.engine == "onnxruntime" and p.ok),
              key=lambda p: p.energy_mj)
    for g in (p for p in profiles if p.engine == "fakegpu"):
        assert g.ok and g.energy_source == "estimated"
        # busy time x 56 W dynamic on top of the host's share: far above the host share alone
        assert g.energy_mj >= g.cpu_ms * 2.0 + 0.5 * g.p50_ms * 56.0
        assert g.energy_mj > 10 * cpu.energy_mj
    choice = select(profiles, Constraints(latency_ms=1000.0))
    assert choice.profile.engine == "onnxruntime"


def test_a_metered_accelerator_is_billed_by_its_meter(tmp_path, fast_profiler_cfg):
    fake = FakeNvml([{"name": "NVIDIA L4", "mj": 0, "mw": 0}])
    profiles = _profile(tmp_path, fast_profiler_cfg,
                        [GpuBackend(fake, mj_per_run=7)], accelerators=(L4,),
                        gpu_meters=nvml_mod.gpu_meters(fake))
    assert profiles and all(p.ok for p in profiles)
    for g in profiles:
        assert g.energy_source == "estimated+nvml"
        # the counter rose 7 mJ a run and not at all while idle: 7 mJ a run + the host share
        assert g.energy_mj == pytest.approx(7.0 + g.cpu_ms * 2.0, rel=1e-6, abs=1e-6)


def test_check_reports_gpu_meters_and_accelerators(tmp_path):
    import subprocess

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[device]\nprofile = "x86-nvidia-gpu"\nsysfs_root = "{tmp_path}"\n'
                   '[governor]\npolicy = "off"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert "accelerator: 'NVIDIA' (GPU): 16 W idle, 72 W busy (cited)" in r.stderr, r.stderr
