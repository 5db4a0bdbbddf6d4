"""A fake NVIDIA GPU behind a fake `pynvml` module: the hardware boundary, nothing else.

The GPU draws `idle_w` at rest, `busy_w` while a kernel runs and `hold_w` for `hold_s` after
the last kernel ends (a GPU keeps its clocks between frames at a cadence: the lent H200 drew
128-137 W against 81 W idle at 3-4 % utilisation). Its total-energy counter, like NVML's,
moves only every `tick_s` (it reports the energy at the last tick); its power reading is the
power at the last tick. Time is the clock the profiler measures with (time.perf_counter): the
fake accounts the real time a kernel took, so the measurement and the fake see one clock.
`fault` breaks the counter from `fault_at` on: "stuck" (stops moving), "backwards" (loses 5 J),
"jump" (gains 50 kJ at once); `fault_in_kernels` = k sets `fault_at` to the start of the k-th
kernel from now (inside a measuring window after a profiler's warm-up runs, however slowly a
loaded host got there: a time set in advance could pass before the window opened, and a step
before the window's first reading is invisible).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

NVML_CLOCK_SM = 1
REASON_IDLE, REASON_SW_POWER_CAP, REASON_SW_THERMAL = 0x1, 0x4, 0x20
REASON_HW_THERMAL, REASON_HW_POWER_BRAKE = 0x40, 0x80


class FakeGpu:
    """One GPU's power over time (module doc)."""

    def __init__(self, name: str = "NVIDIA Fake L4", idle_w: float = 20.0,
                 busy_w: float = 65.0, hold_w: float = 60.0, hold_s: float = 5.0,
                 tick_s: float = 0.1, clock: Callable[[], float] = time.perf_counter):
        self.name, self.idle_w, self.busy_w, self.hold_w = name, idle_w, busy_w, hold_w
        self.hold_s, self.tick_s, self._clock = hold_s, tick_s, clock
        self._t0 = self._t = clock()
        self._e = 0.0  # J at self._t
        self._tick_e = 0.0  # J at the last tick boundary passed
        self._busy = False
        self._hold_until = -math.inf
        self.fault = ""
        self.fault_at = math.inf
        self.fault_in_kernels: int | None = None
        self.reasons = REASON_IDLE
        self.sm_mhz, self.max_sm_mhz = 1980, 1980

    def _power(self, t: float) -> float:
        if self._busy:
            return self.busy_w
        return self.hold_w if t < self._hold_until else self.idle_w

    def _advance(self, now: float) -> None:
        """Integrate up to `now`, piecewise between tick boundaries and the hold's end."""
        while self._t < now:
            k = math.floor((self._t - self._t0) / self.tick_s) + 1
            next_tick = self._t0 + k * self.tick_s
            while next_tick <= self._t:  # float rounding at a boundary: the next one
                k += 1
                next_tick = self._t0 + k * self.tick_s
            stops = [now, next_tick]
            if self._t < self._hold_until:
                stops.append(self._hold_until)
            t1 = min(stops)
            self._e += self._power(self._t) * (t1 - self._t)
            self._t = t1
            if t1 == next_tick:
                self._tick_e = self._e

    def kernel(self, run: Callable[[], Any], busy_s: float | None = None) -> Any:
        """Run `run` as a kernel: busy power while it runs (or, with `busy_s`, for that long
        from its start: the GPU's own time, however late the host that waits for it comes
        back), then the hold."""
        self._advance(self._clock())
        start = self._t
        if self.fault_in_kernels is not None:
            self.fault_in_kernels -= 1
            if self.fault_in_kernels <= 0:
                self.fault_at, self.fault_in_kernels = start, None
        self._busy = True
        try:
            return run()
        finally:
            now = self._clock()
            self._advance(now if busy_s is None else min(now, start + busy_s))
            self._busy = False
            self._hold_until = self._t + self.hold_s

    def counter_mj(self) -> int:
        """The total-energy counter (mJ) as NVML reports it: the energy at the last tick."""
        now = self._clock()
        self._advance(now)
        e = self._tick_e
        if now >= self.fault_at:
            if self.fault == "stuck":
                return int(self._frozen if hasattr(self, "_frozen") else self._freeze(e))
            if self.fault == "backwards":
                e -= 5.0
            if self.fault == "jump":
                e += 50_000.0
        return int(e * 1e3)

    def _freeze(self, e: float) -> float:
        self._frozen = e * 1e3
        return self._frozen

    def power_mw(self) -> int:
        """The power reading (mW): the power at the last tick."""
        self._advance(self._clock())
        return int(self._power(self._t) * 1e3)


class FakeNvml:
    """The parts of `pynvml` edgerun calls, over FakeGpus."""

    NVML_CLOCK_SM = NVML_CLOCK_SM

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self.gpus[h].counter_mj()

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.gpus[h].power_mw()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.gpus[h].reasons

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self.gpus[h].sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return self.gpus[h].max_sm_mhz


class GpuSession:
    """A session "on the GPU": the engine's real session computes the output; its runs are
    the fake GPU's kernels. With `kernel_s`, the work is off the host as on a real GPU: the
    real output computed once at load, each run a kernel of `kernel_s` that the host waits
    for (sleeping, no host CPU). The GPU is busy for `kernel_s`, not for as long as the host
    slept: a host descheduled past the kernel's end finds the GPU holding, as a real one
    would (the fake's busy time is the GPU's, never the host's scheduling)."""

    def __init__(self, inner: Any, gpu: FakeGpu, kernel_s: float | None = None):
        self._inner, self._gpu, self._kernel_s = inner, gpu, kernel_s
        self.actual_device = f"GPU.0 (NVIDIA CUDA: {gpu.name})"
        self._out: np.ndarray | None = None

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self._kernel_s is None:
            return self._gpu.kernel(lambda: self._inner.infer(batch))
        if self._out is None:
            self._out = self._inner.infer(batch)
        return self._gpu.kernel(lambda: (time.sleep(self._kernel_s), self._out)[1],
                                busy_s=self._kernel_s)

    def close(self) -> None:
        self._inner.close()


def gpu_backend(base: type, gpu: FakeGpu, kernel_s: float | None = None) -> Any:
    """A backend of class `base` whose sessions run on `gpu` (GpuSession)."""

    class OnGpu(base):  # type: ignore[valid-type,misc]
        name = f"fakegpu-{base.name}"

        def load(self, variant: Any) -> GpuSession:
            return GpuSession(super().load(variant), gpu, kernel_s)

    return OnGpu()
