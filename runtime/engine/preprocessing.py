"""Where frames are preprocessed: on the CPU (OpenCV + numpy) or by the OpenCL kernel.

Profiled like a variant knob: the first time a (frame size, input shape) pair is seen, both
paths run on that frame and the one with the lower energy per frame (idle baseline
subtracted, same meter as the profiler) is used from then on; the measurement is kept for
health. Both produce the same tensor within one 8-bit step (tests/engine/test_opencl.py).

When the ladder was chosen by the box (runtime/choice/ladders.py `Ladder.pre_paths`), each
rung runs on the path its configuration was judged on, whatever this chooser's own ranking:
the box figured the rung's energy and end-to-end latency with that path, and the cheaper path
per tensor can be the one that misses an end-to-end target or the offered rate. A session
preprocesses through `for_variant(its variant id)`, which reads the variant's path from the
pins current at each frame, so a rebuilt ladder re-pins the running rung without a switch and
a rung switch (to another input size or not) uses that rung's own path. The measurement still
runs for the report (health's `preprocess`), whose chosen row says which path is used and why.
A pinned path that is not available for a size, or any non-CPU path that fails on a frame,
gives way to the CPU path, with a warning once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
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


CPU = "cpu"
BY_BOX = "selected by the box choice"
CHEAPEST = "lowest preprocessing energy"

_Row = tuple[float, float, str, Path_]  # (mJ, ms, path, fn) as measured


class PreprocessChooser:
    """Picks and caches the preprocessing path per (frame size, input shape): the variant's
    pinned one (`pin`), else the cheaper measured one (see module doc)."""

    def __init__(self, pre: Preprocess, meter: Any, idle_w: float,
                 opencl: Callable[[tuple[int, ...]], Path_] | None = None,
                 opencl_name: str = "opencl", pins: Mapping[str, str] | None = None):
        self._pre, self._meter, self._idle_w = pre, meter, idle_w
        self._opencl, self._opencl_name = opencl, opencl_name
        self._measured: dict[tuple, list[_Row]] = {}
        self._use: dict[tuple, tuple[str, Path_, str]] = {}  # (key, pin) -> (path, fn, why)
        self._failed: set[tuple] = set()  # (key, path): failed on a frame, not used again
        self._shown: dict[tuple, tuple[str, str]] = {}  # key -> (path, why) in the report
        self._warned: set[tuple] = set()
        self._views: dict[str, _ForVariant] = {}
        self.pins: Mapping[str, str] = dict(pins or {})  # variant id -> path (`pin`)
        self.report: dict[str, list[dict]] = {}

    def pin(self, paths: Mapping[str, str]) -> None:
        """Run each variant of `paths` (id -> cpu | opencl:<device>) on its path from the next
        frame on; the others on the cheaper measured path."""
        self.pins = dict(paths)  # replaced whole: the preprocessing threads read it

    def for_variant(self, variant_id: str) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
        """The preprocessing of one variant's session: its pinned path, read at each frame
        (one object per variant, so the pipeline's per-preprocessing caches stay small)."""
        view = self._views.get(variant_id)
        if view is None:
            view = self._views[variant_id] = _ForVariant(self, variant_id)
        return view

    def __call__(self, frame: np.ndarray, shape: tuple[int, ...], pin: str = "") -> np.ndarray:
        """The tensor for `frame` at the model input `shape`, by path `pin` when given (and
        usable), else by the cheaper measured path."""
        key = (frame.shape, shape)
        use = self._use.get((key, pin))
        if use is None:
            use = self._use[(key, pin)] = self._resolve(frame, shape, pin)
        if self._shown.get(key) != (use[0], use[2]):
            self._show(frame, shape, use)
        name, fn, _ = use
        if name == CPU:
            return fn(frame)
        try:
            return fn(frame)
        except Exception as e:  # a device lost mid-run: this frame and the next on the CPU
            self._failed.add((key, name))
            self._use = {k: u for k, u in self._use.items() if k[0] != key}
            log.warning("preprocessing path %s failed on a %s frame (%s); using the CPU path "
                        "for this size from now on", name, frame.shape, e)
            return self(frame, shape, pin)

    def _resolve(self, frame: np.ndarray, shape: tuple[int, ...], pin: str
                 ) -> tuple[str, Path_, str]:
        """(path, fn, why) for `pin` at this frame size (measured first when new)."""
        key = (frame.shape, shape)
        rows = self._measured.get(key)
        if rows is None:
            rows = self._measured[key] = self._measure(frame, shape)
        usable = [r for r in rows if (key, r[2]) not in self._failed]
        cpu = self._cpu(shape)
        if pin:
            got = next((r for r in usable if r[2] == pin), None)
            if got is not None:
                return pin, got[3], BY_BOX
            if (key, pin) in self._failed:  # said when it failed
                return CPU, cpu, f"the CPU path: {pin}, the box choice's, failed on a frame"
            if (key, pin) not in self._warned:
                self._warned.add((key, pin))
                log.warning("preprocessing %s: %s, the box choice's path, is not available "
                            "here (usable: %s); using the CPU path", _label(frame, shape), pin,
                            ", ".join(r[2] for r in usable) or "none")
            return CPU, cpu, f"the CPU path: {pin}, the box choice's, is not available"
        if not usable:
            return CPU, cpu, "the CPU path: no other usable"
        _mj, _ms, name, fn = min(usable, key=lambda r: (r[0], r[1]))
        return name, fn, CHEAPEST

    def _cpu(self, shape: tuple[int, ...]) -> Path_:
        """The CPU path for an input shape (OpenCV + numpy, the manifest's preprocessing)."""
        return lambda f: self._pre.apply(f, shape)

    def _measure(self, frame: np.ndarray, shape: tuple[int, ...]) -> list[_Row]:
        """Each path's cost on this frame (a path that fails is left out, said once)."""
        cpu = self._cpu(shape)
        paths = [(CPU, cpu)]
        if self._opencl is not None and frame.ndim == 3 and frame.dtype == np.uint8:
            try:
                paths.append((self._opencl_name, self._opencl(shape)))
            except Exception as e:  # no device, unsupported layout: the CPU path stays
                log.info("OpenCL preprocessing unavailable: %s", e)
        rows: list[_Row] = []
        for name, fn in paths:
            try:
                ms, mj = measure(fn, frame, self._meter, self._idle_w)
            except Exception as e:
                log.warning("preprocessing path %s failed on a %s frame: %s", name,
                            frame.shape, e)
                continue
            rows.append((mj, ms, name, fn))
        return rows

    def _show(self, frame: np.ndarray, shape: tuple[int, ...], use: tuple[str, Path_, str]
              ) -> None:
        """Health's rows for this size: each path measured, the one used and why."""
        key, (name, _fn, why) = (frame.shape, shape), use
        self._shown[key] = (name, why)
        rows = self._measured.get(key, [])
        label = _label(frame, shape)
        self.report = {**self.report, label: [
            {"path": n, "ms": round(t, 4), "mj": round(e, 4), "chosen": n == name,
             **({"why": why} if n == name else {})} for e, t, n, _ in rows]}
        log.info("preprocessing %s: %s (%s; %s)", label, name, why, ", ".join(
            f"{n} {t:.3f} ms {e:.3f} mJ" for e, t, n, _ in rows) or "none measured")


def _label(frame: np.ndarray, shape: tuple[int, ...]) -> str:
    return f"{frame.shape[1]}x{frame.shape[0]}->{shape[-1]}x{shape[-2]}"


class _ForVariant:
    """One variant's preprocessing: the chooser with that variant's pin (see module doc)."""

    def __init__(self, chooser: PreprocessChooser, variant_id: str):
        self.chooser, self.variant_id = chooser, variant_id

    def __call__(self, frame: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor for `frame` at `shape` on this variant's path."""
        return self.chooser(frame, shape, self.chooser.pins.get(self.variant_id, ""))
