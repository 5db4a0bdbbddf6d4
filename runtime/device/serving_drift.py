"""The running accelerator variant's energy as served, on its own meter, and the re-rank when
it says the profile was wrong (runtime/choice/rerank.py decides; this reads and acts).

A variant on an accelerator spends little host CPU: the live figure learnt from CPU time
(runtime/device/live_energy.py) cannot see what the device draws between frames. So while it
serves, its GPU's meter (power/nvml.py) is read at every control tick over a window of frames
(`ServedWindow`): the window is at least the meter's `min_window_s` (its quantisation error
under 5 %, power/meter_resolution.py) and MIN_INFERENCES long, restarted when the variant
changes or the profiler runs (its work would be billed to the frames). A window's figure is

    live mJ = host CPU s per inference x the profile's W per core
            + (the GPU's J over the window - its idle floor x the window's s) / inferences

at the rate actually served (inferences / s over the window); the idle floor is the one the
profiler measured (`Measured.gpu_idle_w`). It becomes the variant's live energy (the control
step's rungs), and when it is above the profile's at-rate figure by more than the meter's
error the profile's figure is replaced by it and the choice made again, through the path a
background re-profile's result takes (`install_model`), with one `rerank` event: the two
figures, the error and the outcome. At most one re-rank per variant every
`[daemon] rerank_every_s`. Only the [model]'s variant is watched, and not while a
`[[sources]]` model runs on the same accelerator (its energy would be billed to the frames).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from power.accelerators import on_host
from power.nvml import meter_for
from power.sensors import SensorError
from runtime.choice import at_rate, rerank
from runtime.choice.accel_window import MAX_WINDOW_S
from runtime.frames.pipeline import live_id

log = logging.getLogger("edgerun.daemon")

MIN_INFERENCES = 20  # a window's fewest inferences (at 20 Hz: 1 s)


@dataclass(frozen=True)
class Figure:
    """One window's live figure of a variant."""

    variant_id: str
    rate_hz: float  # inferences per second served over the window
    live_mj: float  # per inference, host share + accelerator above idle
    error: float  # the meter's relative quantisation error over the window
    window_s: float
    inferences: int


class ServedWindow:
    """Windows of one variant at a time on its accelerator's meter. Pure: fed readings."""

    def __init__(self) -> None:
        self._start: tuple[str, float, float, int, float] | None = None  # vid, t, J, n, cpu

    def reset(self) -> None:
        """Drop the window under way (the profiler ran, the meter failed)."""
        self._start = None

    def feed(self, variant_id: str, t: float, j: float, n: int, cpu_s: float,
             need_s: float, idle_w: float, w_per_core: float,
             error_of: Any) -> Figure | None:
        """A reading at `t` (s) of the meter (`j`, cumulative J) and of the variant's served
        inferences and their CPU s (cumulative); a Figure when the window is long enough
        (`need_s`, MIN_INFERENCES), which then starts again from this reading.
        `error_of(window_s)`: the meter's relative error over a window that long."""
        s = self._start
        if s is None or s[0] != variant_id or j < s[2] or n < s[3] or t <= s[1]:
            # another variant, or a counter that went backwards: a fresh window
            self._start = (variant_id, t, j, n, cpu_s)
            return None
        _, t0, j0, n0, c0 = s
        dt, dn = t - t0, n - n0
        if dt < need_s or dn < MIN_INFERENCES:
            return None
        self._start = (variant_id, t, j, n, cpu_s)
        accel_mj = max(j - j0 - idle_w * dt, 0.0) / dn * 1e3
        host_mj = max(cpu_s - c0, 0.0) / dn * w_per_core * 1e3
        return Figure(variant_id, dn / dt, host_mj + accel_mj, error_of(dt), dt, dn)


def _shared(d: Any, meter: Any) -> bool:
    """Whether a `[[sources]]` model's running variant is on the same accelerator: its
    energy would be billed to the [model]'s frames (not watched then)."""
    for m in d.box.source_models.values():
        q = m.by_id.get(m.rungs[m.current].variant_id) if m.rungs else None
        if q is not None and meter_for(d.gpu_meters, q.actual_device or q.device) is meter:
            return True
    return False


class ServingDrift:
    """The watch on the running [model] variant (module doc)."""

    def __init__(self, clock: Any = time.monotonic):
        self._clock = clock
        self.window = ServedWindow()
        self.last: dict[str, float] = {}  # variant id -> monotonic time of its last re-rank
        self.figure: Figure | None = None  # the last window's

    def tick(self, d: Any) -> None:
        """One control tick of what is served, `d` (runtime.device.serving.Serving, whose
        tick calls this): read the running variant's accelerator meter; re-rank on drift."""
        if d.simulated or d.pipeline is None:  # a simulated device's meters are not this host's
            return
        a = d.pipeline.active
        p = d.box.model.by_id.get(a.variant_id) if a else None
        device = (p.actual_device or p.device) if p is not None else ""
        meter = meter_for(d.gpu_meters, device) if p is not None and not on_host(device) \
            else None
        idle = d.box.model.gpu_idle_w.get(meter.where) if meter is not None else None
        if p is None or meter is None or idle is None or d.profiler.busy() \
                or _shared(d, meter):
            self.window.reset()
            return
        n, cpu = d.energy.served.get(live_id("", p.variant_id), (0, 0.0))
        res = meter.resolution()
        need = res.min_window_s()
        try:
            j = meter.energy_j()
        except SensorError as e:
            log.info("served energy of %s not read: %s", p.variant_id, e)
            self.window.reset()
            return
        fig = self.window.feed(p.variant_id, self._clock(), j, n, cpu,
                               min(need, MAX_WINDOW_S) if math.isfinite(need) else MAX_WINDOW_S,
                               idle, d.device.power.active_w_per_core, res.error)
        if fig is None:
            return
        self.figure = fig
        d.energy.live[live_id("", p.variant_id)] = fig.live_mj / 1e3  # the control step's
        now = self._clock()
        if not rerank.due(self.last, p.variant_id, now, d.cfg.daemon.rerank_every_s):
            return
        drift = rerank.check(p, fig.rate_hz, fig.live_mj, fig.error)
        if drift is not None:
            self.last[p.variant_id] = now
            self._rerank(d, drift)

    def _rerank(self, d: Any, drift: rerank.Drift) -> None:
        """Replace the profile's figure and choose again (module doc); one event."""
        before = d.box.model.rungs[-1].variant_id if d.box.model.rungs else ""
        why = f"re-ranked {drift.variant_id}: {drift.why}"
        log.warning("%s; choosing again", why)
        m = d.box.model.measured()
        d.install_model(replace(m, profiles=rerank.swap(m.profiles, drift.replacement)), why)
        after = d.box.model.rungs[-1].variant_id if d.box.model.rungs else ""
        outcome = (f"{after} chosen instead of {before}" if after != before
                   else f"{after} still chosen")
        d.event("rerank", "warning", variant=drift.variant_id,
                rate_hz=round(drift.rate_hz, 3), profiled_mj=round(drift.profiled_mj, 4),
                live_mj=round(drift.live_mj, 4),
                error=round(drift.error, 4) if math.isfinite(drift.error) else None,
                reason=drift.why, outcome=outcome, choice=after,
                label=at_rate.label(at_rate.served([drift.replacement], drift.rate_hz)[0]))
        self.window.reset()
