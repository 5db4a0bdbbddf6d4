"""NVIDIA GPUs' own energy meters through NVML (`nvidia-ml-py`, module `pynvml`; optional).

Per GPU: the total energy counter where the GPU has one (`nvmlDeviceGetTotalEnergyConsumption`,
mJ since the driver loaded, Volta and later), else power samples (`nvmlDeviceGetPowerUsage`, mW)
integrated by the trapezoid rule each time the meter is read. A missing library, driver or GPU
is "no GPU meter" in one log line, never an error (REFERENCE.md "Measuring the system").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from power.accel_throttle import DeviceState, from_nvml_reasons
from power.meter_resolution import NVML_POWER_AVERAGING_S, Resolution, measure_period
from power.sensors import IntegratingMeter, SensorError

log = logging.getLogger(__name__)


class NvmlMeter:
    """One GPU's cumulative energy in joules (monotonic), read through NVML."""

    source = "nvml"

    def __init__(self, nvml: Any, index: int, clock: Callable[[], float] = time.monotonic):
        self._nvml = nvml
        self.index = index
        self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(self._handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self._integrating: IntegratingMeter | None = None
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self.counter = "total energy counter (mJ)"
        except nvml.NVMLError:  # pre-Volta, or not supported on this board
            self._integrating = IntegratingMeter("nvml", self._power_w, clock=clock)
            self.counter = "power samples (mW), integrated"
        # an integrating meter is only as good as how often it is read: read it per inference
        self.needs_samples = self._integrating is not None
        self.where = f"GPU {index} ({self.name}): {self.counter}"
        self._clock = clock
        self._resolution: Resolution | None = None

    def _power_w(self) -> float:
        try:
            return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3
        except self._nvml.NVMLError as e:
            raise SensorError(f"NVML power of GPU {self.index} ({self.name}): {e}") from e

    def resolution(self) -> Resolution:
        """How fine this meter is, measured once (power/meter_resolution.py): the counter's
        update period by polling it (~0.5 s on a 100 ms counter); for power samples, the
        reading's update period by polling it, plus NVML's documented 1 s averaging."""
        if self._resolution is None:
            if self._integrating is None:
                self._resolution = measure_period(self.counter_mj, clock=self._clock)
            else:
                r = measure_period(self._power_w, clock=self._clock)
                self._resolution = Resolution(
                    r.period_s, NVML_POWER_AVERAGING_S, "measured",
                    f"{r.note}; averaging documented (NVML, Ampere and later)")
        return self._resolution

    def counter_mj(self) -> float:
        """The raw reading that changes when the device updates it: the energy counter in mJ,
        or (power samples) the power in mW. SensorError when NVML stops answering."""
        try:
            if self._integrating is not None:
                return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle))
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._nvml.NVMLError as e:
            raise SensorError(f"NVML reading of GPU {self.index} ({self.name}): {e}") from e

    def clock_state(self) -> DeviceState | None:
        """Whether the GPU's clocks are held down now (power/accel_throttle.py), from NVML's
        clock-event reasons (the older name, clocks throttle reasons, on older bindings);
        None when NVML cannot say."""
        for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                return from_nvml_reasons(int(fn(self._handle)))
            except self._nvml.NVMLError:
                return None
        return None

    def energy_j(self) -> float:
        """Cumulative joules; SensorError when NVML stops answering."""
        if self._integrating is not None:
            return self._integrating.energy_j()
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3
        except self._nvml.NVMLError as e:
            raise SensorError(f"NVML energy of GPU {self.index} ({self.name}): {e}") from e

    def covers(self, actual_device: str) -> bool:
        """Whether this GPU is the device a session reports (its name appears in it)."""
        return self.name.lower() in actual_device.lower()


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def gpu_meters(nvml: Any = None) -> list[NvmlMeter]:
    """A meter per NVIDIA GPU, or none (one log line saying why)."""
    nvml = nvml if nvml is not None else _import_nvml()
    if nvml is None:
        log.info("no GPU meter: NVML's Python binding (nvidia-ml-py) is not installed")
        return []
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA driver
        log.info("no GPU meter: NVML did not start (%s)", e)
        return []
    meters = []
    for i in range(count):
        try:
            meters.append(NvmlMeter(nvml, i))
        except Exception as e:  # one broken GPU costs its own meter only
            log.warning("GPU %d has no meter: NVML refused it (%s)", i, e)
    if not meters:
        log.info("no GPU meter: NVML reports no GPU")
    return meters


def meter_for(meters: list[NvmlMeter], actual_device: str) -> NvmlMeter | None:
    """The meter of the GPU a session runs on: by name; an engine that names no GPU (ORT's
    'CUDA', 'TensorRT') on a box with exactly one GPU gets that GPU's meter."""
    named = [m for m in meters if m.covers(actual_device)]
    if named:
        return named[0]
    nvidia_engines = ("cuda", "tensorrt", "nv_tensorrt")
    if len(meters) == 1 and actual_device.strip().lower().startswith(nvidia_engines):
        return meters[0]
    return None
