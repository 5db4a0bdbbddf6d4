"""Throttling on an accelerator, as the device says (power/accel_throttle.py), and the
slow-inference check that asks it (runtime/device/profiling.py): pure, on tables; NVML faked
at the module boundary, devfreq on a sysfs fixture."""

from __future__ import annotations

import pytest
from support.fake_gpu import REASON_HW_THERMAL, REASON_IDLE, REASON_SW_POWER_CAP, FakeGpu, FakeNvml

from power import nvml as nvml_mod
from power.accel_throttle import DeviceState, from_devfreq, from_nvml_reasons, read_devfreq
from runtime.device.profiling import reprofile_reason


@pytest.mark.parametrize("mask, throttled, words", [
    (0x0, False, "no slowdown"), (0x1, False, "GPU idle"), (0x2, False, "no slowdown"),
    (0x10, False, "no slowdown"), (0x100, False, "no slowdown"),
    (0x4, True, "software power cap"), (0x8, True, "hardware slowdown"),
    (0x20, True, "software thermal slowdown"), (0x40, True, "hardware thermal slowdown"),
    (0x80, True, "hardware power brake"), (0x1 | 0x20, True, "software thermal"),
])
def test_nvml_clock_event_reasons(mask, throttled, words):
    s = from_nvml_reasons(mask)
    assert s.throttled is throttled and words in s.why


@pytest.mark.parametrize("cur, top, throttled", [
    (624_750_000, 624_750_000, False), (306_000_000, 624_750_000, True),
    (0, 624_750_000, None), (624_750_000, 0, None), (10**12, 624_750_000, None),
])
def test_devfreq_against_its_maximum(cur, top, throttled):
    s = from_devfreq(cur, top)
    assert (s is None) if throttled is None else (s.throttled is throttled)


def test_devfreq_files(tmp_path):
    assert read_devfreq(tmp_path) is None
    (tmp_path / "cur_freq").write_text("306000000\n")
    (tmp_path / "max_freq").write_text("624750000\n")
    s = read_devfreq(tmp_path)
    assert s is not None and s.throttled and "306 of 625 MHz" in s.why


def test_the_gpu_meter_asks_nvml():
    gpu = FakeGpu()
    meter = nvml_mod.gpu_meters(FakeNvml([gpu]))[0]
    gpu.reasons = REASON_IDLE
    assert meter.clock_state() == from_nvml_reasons(REASON_IDLE)
    gpu.reasons = REASON_SW_POWER_CAP | REASON_HW_THERMAL
    assert meter.clock_state().throttled


@pytest.mark.parametrize("device, want, slow", [
    (None, "p95 9.00 ms vs 3.00 ms profiled: the device is slower", True),  # cannot tell
    (DeviceState(False, "NVML clock events: no slowdown (0x0)"), None, False),  # queueing
    (DeviceState(True, "NVML clock events: software thermal slowdown (0x20)"),
     "p95 9.00 ms vs 3.00 ms profiled: the device is throttled (NVML clock events: software "
     "thermal", True),
])
def test_slow_inference_on_an_accelerator_asks_the_device(device, want, slow):
    why, is_slow = reprofile_reason(40.0, 40.0, 10.0, 9.0, 3.0, 100, 2.0, None, device)
    assert is_slow is slow
    assert (why is None) if want is None else why.startswith(want)
