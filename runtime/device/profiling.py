"""Profiling while the daemon serves: the background thread that measures a model again (a
re-profile, another model chosen, the cold start's refinement), what a profiling run tells
systemd and the terminal as it goes, and when the device asks for a re-profile.

A job runs on the `reprofile` thread, one at a time (`Profiler.lock`), below the frames (the
measurement pauses the pipeline in short chunks); its result goes on the daemon's install
queue as an `Install` for the main loop to take between ticks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from power.accel_throttle import DeviceState
from power.accelerators import on_host
from runtime.choice.measure import Measured
from runtime.durable import crash_point
from runtime.frames.model_counts import model_id

log = logging.getLogger("edgerun.daemon")  # the journal's name for these lines

PROGRESS_LOG_S = 2.0  # profiling progress on the terminal: at most one line this often
REPROFILE_EVERY_S = 600.0  # conditions ask for a re-profile at most this often
ALONE_SAMPLES = 200  # the throttle check's inferences: the most recent that ran alone


class Stopping(Exception):
    """A stop was requested while a long step (profiling, a bundle download) was running."""


@dataclass(frozen=True)
class Install:
    """A measured model waiting on the install queue for the main loop (background threads
    put, the main loop takes between ticks).

    `version`: a model-store version (an OTA deploy or choose_model): the pointer is switched
    and probation starts. Otherwise a re-measurement of a model directory made while the model
    generation was `gen`: dropped when another model was installed since it began."""

    measured: Measured
    why: str
    version: str | None = None
    gen: int | None = None


def progress_reporter(notify: Any, stopping: Callable[[], bool]) -> Callable[[int, int, str],
                                                                              None]:
    """A profiling run's progress callback: raises Stopping on a stop request, keeps
    systemd's start timeout moving (`notify`: runtime.device.systemd.Notifier) and tells the
    terminal how far it got."""
    said = [-math.inf, ""]  # when and what the terminal was last told

    def progress(i: int, n: int, name: str) -> None:
        if stopping():
            raise Stopping(f"stop requested while profiling {name} ({i}/{n})")
        if threading.current_thread().name == "model-install":
            crash_point("profile")  # tests: kill -9 while a new version is profiled
        # A cold first start profiles every variant (minutes): keep systemd's start
        # timeout moving and say how far it got.
        notify.send("EXTEND_TIMEOUT_USEC=120000000", f"STATUS=profiling {name}: variant {i}/{n}")
        # ... and the terminal (the log, stderr): a phase's first and last variant, and
        # at most one line every PROGRESS_LOG_S in between.
        now = time.monotonic()
        if i == n or name != said[1] or now - said[0] >= PROGRESS_LOG_S:
            said[:] = [now, name]
            log.info("profiling %s: variant %d/%d", name, i, n)

    return progress


class Profiler:
    """The reprofile thread of one daemon. `event(type, severity, **fields)` tells the
    operator; `queue_install(Install)` hands a result to the main loop."""

    def __init__(self, event: Callable[..., None], queue_install: Callable[[Install], None]):
        self.event = event
        self.queue_install = queue_install
        self.lock = threading.Lock()  # held while a job runs
        self.thread: threading.Thread | None = None
        self.last = -math.inf  # monotonic time the last re-profile was asked for

    def busy(self) -> bool:
        """Whether a profiling job runs now."""
        return self.lock.locked()

    def load(self, measure: Callable[[], Measured], why: str, gen: int,
             wait: bool = False) -> None:
        """Profile in the background (minutes on a cold cache must not stall the main loop
        and its watchdog beats); `wait`: after the profiling under way (another model
        chosen), instead of skipped (a re-profile). Main thread only."""
        if self.busy() and not wait:
            self.event("reprofile_skipped", "info", reason=f"{why}: already profiling")
            return
        self.last = time.monotonic()
        log.info("profiling in the background: %s%s", why, ", after the profiling under way"
                 if self.busy() else "")
        self.event("reprofile", "info", reason=why)
        self.run(measure, why, gen, wait)

    def run(self, job: Callable[[], Measured], why: str, gen: int, wait: bool = False) -> None:
        """Run a profiling job (returning a Measured) on the reprofile thread, made while the
        model generation is `gen`. Skipped while another one runs, unless `wait`."""
        if not wait and not self.lock.acquire(blocking=False):
            self.event("reprofile_skipped", "info", reason=f"{why}: already profiling")
            return

        def work() -> None:
            if wait:
                self.lock.acquire()
            try:
                self.queue_install(Install(job(), why, gen=gen))
            except Stopping:
                log.info("background profiling abandoned: the daemon is stopping")
            except Exception as e:
                log.exception("profiling failed (%s); keeping the current model and profiles",
                              why)
                self.event("reprofile_failed", "warning", reason=why, error=str(e)[:300])
            finally:
                self.lock.release()

        self.thread = threading.Thread(target=work, name="reprofile", daemon=True)
        self.thread.start()

    def due(self, temp: float | None, pipeline: Any, model: Any, daemon_cfg: Any,
            live_j: float | None = None,
            device_state: Callable[[str], DeviceState | None] | None = None
            ) -> tuple[str | None, dict[str, Any] | None]:
        """(why a re-profile of the [model] is due or None, the `slow_inference` event's
        fields when it runs slower than profiled): the temperature `temp` moved far from the
        profiling one, or inference became slower than profiled (throttling); at most once
        per REPROFILE_EVERY_S, and not while a job runs (the start-up refinement: asked again
        when it ends). `model`: the [model]'s ServedModel; `daemon_cfg`: [daemon]; `live_j`:
        the running variant's live energy per inference (runtime.device.live_energy), from
        which its CPU time per inference against the profiled one follows; `device_state`:
        what the accelerator a session reports says of its clocks (None: nothing to ask)."""
        if time.monotonic() - self.last < REPROFILE_EVERY_S or self.busy():
            return None, None
        a = pipeline.active
        # the [model]'s own inferences (not another camera's model's, nor a tiled frame's
        # whole time), the last ALONE_SAMPLES that ran alone within REPROFILE_EVERY_S (the
        # last seconds on a busy camera, minutes on a slow one: it needs 50), whose wall
        # time is what its profile measured, one inference with nothing beside it. One
        # that shared the box's cores with the
        # pipeline's capture and preprocessing (a backlog) is slower in wall time and in CPU
        # time (caches, a sibling hyperthread), and re-profiling cannot change that: the
        # re-profile measured the same figures again, on the cores the frames needed
        # (throughput 0.3x the hand loop for seconds, bench/overhead.py). A box that never
        # runs a frame alone (a continuous backlog) is judged by its temperature.
        mine = pipeline.models.tally(model_id("", model.manifest),
                                     time.monotonic() - REPROFILE_EVERY_S)
        alone = mine.alone_ms[-ALONE_SAMPLES:]
        p95 = float(np.percentile(alone, 95)) if alone else None
        prof = model.by_id.get(a.variant_id) if a else None
        dev = None
        if prof is not None and device_state is not None \
                and not on_host(prof.actual_device or prof.device):
            dev = device_state(prof.actual_device or prof.device)
        why, slow = reprofile_reason(temp, model.temp_c, daemon_cfg.reprofile_temp_delta_c,
                                     p95, prof.latency(95) if prof else None, len(alone),
                                     daemon_cfg.slow_factor, cpu_ratio(prof, live_j), dev)
        return why, {"variant": a.variant_id, "p95_ms": p95} if slow else None


def cpu_ratio(prof: Any, live_j: float | None) -> float | None:
    """The running variant's CPU time per inference now over the profiled one (live energy
    is CPU time at the profile's own joules per CPU-second, so the ratio of the energies is
    the ratio of the CPU times); 0.0 while no live figure is learnt yet; None when the
    profile has no CPU time or the variant runs on an accelerator (its work is not host CPU
    time: latency alone judges)."""
    if prof is None or not (prof.cpu_ms > 0 and prof.energy_mj > 0):  # nan compares False
        return None
    if not on_host(prof.actual_device or prof.device):  # a GPU's throttling is not host CPU
        return None
    return live_j * 1e3 / prof.energy_mj if live_j else 0.0


def reprofile_reason(temp: float | None, profiled_temp: float | None, delta_c: float,
                     p95_ms: float | None, profiled_p95_ms: float | None, results: int,
                     slow_factor: float, cpu: float | None = None,
                     device: DeviceState | None = None) -> tuple[str | None, bool]:
    """(why a re-profile is due or None, whether inference is slower than profiled): the
    temperature moved more than `delta_c` from the profiling one, or the model's own p95 over
    `results` recent inferences is `slow_factor` x its profiled p95 (throttling). `cpu`: its
    CPU time per inference over the profiled one (`cpu_ratio`; None: not known). `device`: on
    an accelerator, what the device says of its clocks (power/accel_throttle.py): slow
    inference on a device not held down is queueing, not throttling."""
    why = None
    if temp is not None and profiled_temp is not None and abs(temp - profiled_temp) > delta_c:
        why = f"temperature {temp:.1f} °C, profiled at {profiled_temp:.1f} °C"
    # Both a ratio and an absolute margin: sub-millisecond models run a little slower
    # paced (cold caches) than profiled back to back, and that is not throttling.
    slow = profiled_p95_ms is not None and bool(p95_ms) and results >= 50 and (
        p95_ms > slow_factor * profiled_p95_ms and p95_ms - profiled_p95_ms > 1.0)
    # A throttled core does the same work in more CPU time; an inference that waited for the
    # CPU (the daemon's own capture and preprocessing threads beside it on a small box, or
    # another process) is late in wall time only. Re-profiling for that would measure the
    # same figures again, on the CPU the frames need.
    if slow and cpu is not None and cpu <= slow_factor:
        slow = False
    # an accelerator's clocks say it: not held down, the frames queued (a GPU at 3-4 %
    # utilisation serving 20 Hz was 1.6x its back-to-back p95, at full clock)
    if slow and device is not None and not device.throttled:
        slow = False
    if slow:
        why = (f"p95 {p95_ms:.2f} ms vs {profiled_p95_ms:.2f} ms profiled"
               + (f", CPU time per inference {cpu:.1f}x" if cpu is not None else "")
               + (f": the device is throttled ({device.why})" if device is not None
                  else ": the device is slower than when profiled (throttling?)"))
    return why, slow
