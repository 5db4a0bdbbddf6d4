"""The synthetic conveyor: parts from the bundled model's dataset generator at a steady rate
(a simulated camera)."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import zlib
from typing import ClassVar, Protocol

import numpy as np

from power.simclock import WallClock
from runtime.config.source import SourceConfig
from runtime.frames.frame import Frame


class _PartPool:
    """Rendered parts, shared by every synthetic source of the same seed, size and defect
    rate in the process, filled by one background thread.

    Rendering one part costs ~20 ms of CPU (~80 ms wall on a loaded two-core box), more than
    a fast line or several cameras allow, and it is the simulated camera's cost, not the
    inspection's: so the first part is rendered at once, the rest of the `n` parts in the
    background while sources already draw from what exists. One part is rendered per frame
    drawn (`drawn`), as the sources used to render their own: the CPU spent is the same,
    only no frame waits for it."""

    _pools: ClassVar[dict[tuple, _PartPool]] = {}
    _lock = threading.Lock()

    def __init__(self, seed: int, size: int, defect_rate: float, n: int):
        from models.synthetic import CLASSES, render

        self._render, self.classes = render, CLASSES
        self._rng = np.random.default_rng(seed)
        self._size, self._defect_rate, self._n = size, defect_rate, n
        self.parts: list[tuple[np.ndarray, str]] = [self._one()]
        self.ready = threading.Event()  # every part rendered
        self._users = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._credits = threading.Semaphore(0)  # frames drawn, not yet matched by a render

    @classmethod
    def acquire(cls, seed: int, size: int, defect_rate: float, n: int) -> _PartPool:
        """The pool for these settings (made on first use), filling while anyone uses it."""
        with cls._lock:
            key = (seed, size, defect_rate, n)
            pool = cls._pools.get(key)
            if pool is None:
                pool = cls._pools[key] = cls(seed, size, defect_rate, n)
            pool._users += 1
            if not pool.ready.is_set() and pool._thread is None:
                pool._stop.clear()
                pool._thread = threading.Thread(target=pool._fill, name="synthetic-render",
                                                daemon=True)
                pool._thread.start()
            return pool

    def release(self) -> None:
        """One user fewer; the last one stops the filling thread and waits for it (a thread
        still inside OpenCV when the interpreter exits aborts the process)."""
        with self._lock:
            self._users -= 1
            thread = self._thread if self._users == 0 else None
            if thread is not None:
                self._stop.set()
                self._thread = None
        if thread is not None:
            thread.join(10)

    @classmethod
    def stop_all(cls) -> None:
        """At exit: stop every filling thread, even of sources nobody closed."""
        with cls._lock:
            pools = list(cls._pools.values())
        for pool in pools:
            pool._stop.set()
            if pool._thread is not None:
                pool._thread.join(10)

    def _one(self) -> tuple[np.ndarray, str]:
        defect = self._rng.random() < self._defect_rate
        label = int(self._rng.integers(1, len(self.classes))) if defect else 0
        return self._render(self._rng, label, self._size), self.classes[label]

    def drawn(self) -> None:
        """A source drew a part: one more may be rendered."""
        if not self.ready.is_set():
            self._credits.release()

    def _fill(self) -> None:
        # The simulated camera's own work, never the inspection's: at the lowest priority,
        # so a render (one per part drawn) does not take a core from the part just drawn.
        # Before, a PLC-triggered synthetic camera's trigger-to-verdict p99 was 2-3x its p50
        # for its first 256 parts, and not once the pool was full (docs/plc.md).
        with contextlib.suppress(AttributeError, OSError):  # Linux: a thread is a task
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while len(self.parts) < self._n and not self._stop.is_set():
            if self._credits.acquire(timeout=0.2):
                self.parts.append(self._one())  # list.append is atomic; readers see a prefix
        if len(self.parts) >= self._n:
            self.ready.set()


atexit.register(_PartPool.stop_all)


class Clock(Protocol):
    """What paces a synthetic camera: power.simclock's SimClock (the simulated board's
    seconds, in lockstep with the daemon) or WallClock (this host's)."""

    def now(self) -> float: ...
    def wait_until(self, t: float, timeout_s: float) -> bool: ...


class SyntheticConveyor:
    """Parts from the bundled model's dataset generator at a steady rate (a simulated camera).

    Parts come from a pool of `POOL` rendered parts (see _PartPool), drawn at random by each
    source's own generator (seeded by `seed` and the source's name, so two cameras on the same
    line do not show the same sequence). `rate_hz` is per second of `clock`: with the
    simulator, per simulated second (a slowed simulation offers fewer frames a wall second)."""

    live = True
    POOL = 256

    def __init__(self, cfg: SourceConfig, clock: Clock | None = None):
        self._cfg = cfg
        self._clock: Clock = clock if clock is not None else WallClock()
        self.pool = _PartPool.acquire(cfg.seed, cfg.size, cfg.defect_rate, self.POOL)
        self._closed = False
        self._rng = np.random.default_rng([cfg.seed, zlib.crc32(cfg.name.encode())])
        self._n = 0
        self._next_t = self._clock.now()

    def read(self, timeout_s: float) -> Frame | None:
        """The next part; paced to `rate_hz` on its clock."""
        if self._cfg.rate_hz > 0:
            if not self._clock.wait_until(self._next_t, timeout_s):
                return None
            # a slot missed by over a second is dropped, not made up in a burst
            self._next_t = max(self._next_t + 1 / self._cfg.rate_hz, self._clock.now() - 1)
        self._n += 1
        parts = self.pool.parts
        img, truth = parts[int(self._rng.integers(len(parts)))]
        self.pool.drawn()
        return Frame(img.copy(), f"part-{self._n}", truth=truth)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Let go of the pool (its parts stay for the next source of the same settings)."""
        if not self._closed:
            self._closed = True
            self.pool.release()
