"""Where frames are preprocessed: on the CPU (OpenCV + numpy) or by the OpenCL kernel.

Profiled like a variant knob: the first time a (frame size, input shape) pair is seen, both
paths run on that frame and the one with the lower energy per frame (idle baseline
subtracted, same meter as the profiler) is used from then on; the measurement is kept for
health. Both produce the same tensor within one 8-bit step (tests/engine/test_opencl.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.engine.manifest import Preprocess

log = logging.getLogger("edgerun.preprocess")

Path_ = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Measured:
    """One path's cost on one frame size."""

    path: str  # "cpu" | "opencl:<device>"
    ms: float
    mj: float


def measure(fn: Path_, frame: np.ndarray, meter: Any, idle_w: float, runs: int = 20
            ) -> tuple[float, float]:
    """(ms, mJ) per frame of `fn`, after one warm-up call; energy minus the idle draw."""
    fn(frame)
    e0, t0 = meter.energy_j(), time.perf_counter()
    for _ in range(runs):
        fn(frame)
    dt = time.perf_counter() - t0
    de = meter.energy_j() - e0 - idle_w * dt
    return dt / runs * 1e3, max(0.0, de) / runs * 1e3


class PreprocessChooser:
    """Picks and caches the cheaper preprocessing path per (frame size, input shape)."""

    def __init__(self, pre: Preprocess, meter: Any, idle_w: float,
                 opencl: Callable[[tuple[int, ...]], Path_] | None = None,
                 opencl_name: str = "opencl"):
        self._pre, self._meter, self._idle_w = pre, meter, idle_w
        self._opencl, self._opencl_name = opencl, opencl_name
        self._chosen: dict[tuple, Path_] = {}
        self.report: dict[str, list[dict]] = {}

    def __call__(self, frame: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor for `frame` at the model input `shape`, by the cheaper path."""
        key = (frame.shape, shape)
        fn = self._chosen.get(key)
        if fn is None:
            fn = self._chosen[key] = self._choose(frame, shape)
        return fn(frame)

    def _choose(self, frame: np.ndarray, shape: tuple[int, ...]) -> Path_:
        cpu: Path_ = lambda f: self._pre.apply(f, shape)  # noqa: E731
        paths = [("cpu", cpu)]
        if self._opencl is not None and frame.ndim == 3 and frame.dtype == np.uint8:
            try:
                paths.append((self._opencl_name, self._opencl(shape)))
            except Exception as e:  # no device, unsupported layout: the CPU path stays
                log.info("OpenCL preprocessing unavailable: %s", e)
        results = []
        for name, fn in paths:
            try:
                ms, mj = measure(fn, frame, self._meter, self._idle_w)
            except Exception as e:
                log.warning("preprocessing path %s failed on a %s frame: %s", name,
                            frame.shape, e)
                continue
            results.append((mj, ms, name, fn))
        mj, ms, name, fn = min(results, key=lambda r: (r[0], r[1]))
        label = f"{frame.shape[1]}x{frame.shape[0]}->{shape[-1]}x{shape[-2]}"
        self.report[label] = [{"path": n, "ms": round(t, 4), "mj": round(e, 4),
                               "chosen": n == name} for e, t, n, _ in results]
        log.info("preprocessing %s: %s chosen (%s)", label, name, ", ".join(
            f"{n} {t:.3f} ms {e:.3f} mJ" for e, t, n, _ in results))
        return fn
