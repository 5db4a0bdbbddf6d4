"""The box's energy per frame: every stage the process runs, plus its share of the idle floor.

The selector's and the governor's energy used to be the inference threads' CPU time x W per
core, ~0.1 mJ a frame on the bundled model, while capture, decoding, preprocessing, result
building, persistence and publishing cost several mJ: the runtime's own cost was invisible.
Here each control tick closes a `Window`: its wall time, the frames stored in it, the CPU
seconds of each stage (runtime/frames/pipeline.py `take_stage_cpu`, the publisher thread's
from power.cputime) and, where the box has a real meter (RAPL, hwmon, INA3221, battery), the
meter's energy over it. `per_frame` turns the windows into millijoules a frame:

- estimate (no meter, or the meter failed): stage = its CPU-seconds x W per core; idle share
  = the box's idle power / the frame rate (idle_w x window / frames); box = stages + idle;
- meter: box = the meter's energy / frames (measured); the split between stages by a
  regression over the windows of the meter's energy against the stages' CPU time
  (E = floor_w x T + w_per_cpu_s x CPU): stage = its CPU-seconds x the fitted W per
  CPU-second, the idle share = the fitted floor x window / frames. Until the windows allow a
  fit (too few, or no spread in CPU), the split is the estimate's, labelled so.

Nothing measurable is null with a reason, never 0: no frames, a stage whose counters are
missing. A meter that goes away or returns garbage (NaN, a negative delta, more than
MAX_PLAUSIBLE_W, no change for STUCK_WINDOWS windows in a row) is dropped for the estimate,
with one event (`BoxEnergy.tick`). Pure but for `BoxEnergy`, which only keeps windows and
reads the meter it is given.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STAGES = ("capture", "decode", "crop", "preprocess", "infer", "postprocess", "persist",
          "publish")
MODEL_STAGE = "infer"
MAX_PLAUSIBLE_W = 2000.0  # more than this from an edge box's meter is a bad reading
MIN_FIT_WINDOWS = 5  # windows before the regression's split is used
MIN_CPU_SPREAD = 0.1  # relative spread of CPU per second across windows needed for a fit
KEEP_WINDOWS = 60  # ~a minute of windows
MIN_WINDOW_S = 1.0  # a window spans at least this much wall time
# A window the meter did not move in is left out (a counter updated less often than the
# control tick); this many in a row is a stuck meter, dropped (a running box draws power)
STUCK_WINDOWS = 10


@dataclass(frozen=True)
class Window:
    """One accounting window (a control tick)."""

    t_s: float  # wall time
    frames: int  # results stored
    cpu_s: Mapping[str, float | None]  # per stage; None: its counter is missing
    meter_j: float | None = None  # the meter's energy over the window; None: no valid meter


def meter_problem(delta_j: float, t_s: float) -> str | None:
    """Why a meter's reading over a window is garbage (None when it is plausible). Pure."""
    if not math.isfinite(delta_j):
        return f"the meter read {delta_j}"
    if delta_j < 0:
        return f"the meter went back by {-delta_j:.3f} J"
    if t_s > 0 and delta_j / t_s > MAX_PLAUSIBLE_W:
        return f"the meter read {delta_j / t_s:.0f} W (more than {MAX_PLAUSIBLE_W:.0f} W)"
    return None


def fit(windows: Sequence[Window]) -> tuple[float, float] | str:
    """(floor W, W per CPU-second) from a least-squares fit of each window's meter energy
    against its wall time and its stages' CPU time, through the origin; or why not. Pure."""
    rows = [(w.t_s, _cpu(w), w.meter_j) for w in windows
            if w.meter_j is not None and w.t_s > 0]
    if len(rows) < MIN_FIT_WINDOWS:
        return f"{len(rows)} metered windows, {MIN_FIT_WINDOWS} needed for the split"
    rates = [c / t for t, c, _ in rows]
    mean = sum(rates) / len(rates)
    if mean <= 0 or (max(rates) - min(rates)) / mean < MIN_CPU_SPREAD:
        return "the frame rate did not vary enough across windows to split the meter's energy"
    stt = sum(t * t for t, _, _ in rows)
    scc = sum(c * c for _, c, _ in rows)
    stc = sum(t * c for t, c, _ in rows)
    ste = sum(t * e for t, _, e in rows)
    sce = sum(c * e for _, c, e in rows)
    det = stt * scc - stc * stc
    if det <= 0:
        return "the windows' CPU time and wall time are collinear"
    floor_w = (ste * scc - sce * stc) / det
    per_cpu = (stt * sce - stc * ste) / det
    if floor_w < 0 or per_cpu <= 0:
        return (f"the fit is not physical (floor {floor_w:.2f} W, {per_cpu:.2f} W per "
                "CPU-second): other load on the box")
    return floor_w, per_cpu


def _cpu(w: Window) -> float:
    return sum(v for v in w.cpu_s.values() if v is not None)


def per_frame(windows: Sequence[Window], idle_w: float, w_per_cpu_s: float,
              source: str) -> dict[str, Any]:
    """Energy per frame over `windows` (see module doc): box, model share, idle share and
    each stage, in mJ, with the source of each figure and, for any null, the reason. Pure."""
    frames = sum(w.frames for w in windows)
    t_s = sum(w.t_s for w in windows)
    out: dict[str, Any] = {"box_mj": None, "model_mj": None, "idle_mj": None,
                           "stages_mj": dict.fromkeys(STAGES), "source": source,
                           "split": None, "frames": frames, "window_s": round(t_s, 3),
                           "reason": None, "unmeasured": []}
    if frames <= 0:
        out["reason"] = f"no frames in the last {t_s:.0f} s"
        return out
    # a window without frames has nothing to time for a per-frame stage (decode): only the
    # windows that stored frames say whether a stage's counter is missing
    missing = [s for s in STAGES
               if any(w.cpu_s.get(s) is None for w in windows if w.frames > 0)]
    out["unmeasured"] = missing
    cpu = {s: sum(w.cpu_s[s] or 0.0 for w in windows) for s in STAGES if s not in missing}
    metered = [w for w in windows if w.meter_j is not None]
    coeff, floor_w, split = w_per_cpu_s, idle_w, "estimated"
    box_j: float | None = None
    if source != "estimated" and len(metered) >= len(windows) / 2:
        # a window the meter did not move in (a slow counter) is left out, with its frames
        scale = frames / max(sum(w.frames for w in metered), 1)
        box_j = sum(w.meter_j for w in metered) * scale  # type: ignore[misc]
        got = fit(windows)
        if isinstance(got, str):
            split = f"estimated ({got})"
        else:
            floor_w, coeff = got
            split = f"{source} regression over {len(windows)} windows"
    elif source != "estimated":
        out["reason"] = "the meter moved in fewer than half the windows: estimated"
        out["source"] = "estimated"
    stages_j = {s: c * coeff for s, c in cpu.items()}
    idle_j = floor_w * t_s
    if box_j is None:
        box_j = sum(stages_j.values()) + idle_j
    else:  # measured: the floor is what the meter shows beyond the stages
        idle_j = max(box_j - sum(stages_j.values()), 0.0)
    out.update(box_mj=round(box_j / frames * 1e3, 4), idle_mj=round(idle_j / frames * 1e3, 4),
               split=split,
               stages_mj={s: (round(stages_j[s] / frames * 1e3, 4) if s in stages_j else None)
                          for s in STAGES})
    out["model_mj"] = out["stages_mj"][MODEL_STAGE]
    if missing:
        out["reason"] = (f"no counters for {', '.join(missing)}: not in the box figure"
                         if out["reason"] is None else out["reason"])
    return out


class BoxEnergy:
    """Keeps the last windows and the meter's last reading; one `tick` per control tick."""

    def __init__(self, meter: Any, idle_w: float, w_per_cpu_s: float,
                 on_event: Callable[[str, str, dict[str, Any]], None],
                 keep: int = KEEP_WINDOWS):
        self._meter = meter if getattr(meter, "source", "estimated") != "estimated" else None
        self.source = self._meter.source if self._meter is not None else "estimated"
        self.idle_w, self.w_per_cpu_s = idle_w, w_per_cpu_s
        self._event = on_event
        self._windows: collections.deque[Window] = collections.deque(maxlen=keep)
        self._last_j = self._read()
        self.lost: str | None = None  # why the meter was dropped
        self._t: float | None = None  # when the last window closed (monotonic)
        self._publish: float | None = None  # the publisher thread's CPU total then
        self._still = 0  # windows in a row the meter did not move in
        self._pending_frames = 0  # counted since the window opened
        self._pending_cpu: dict[str, float | None] = {}
        self._around: tuple[float | None] | None = None  # around_j's, until the next window

    def _read(self) -> float | None:
        if self._meter is None:
            return None
        try:
            return float(self._meter.energy_j())
        except Exception as e:  # SensorError, OSError, ValueError: the meter went away
            self._drop(f"reading it failed: {e}")
            return None

    def _drop(self, why: str) -> None:
        """Fall back to the estimate for good (until a restart), said once."""
        source = self.source
        self._meter, self.source, self.lost = None, "estimated", why
        self._windows.clear()  # metered and estimated windows are not mixed
        self._event("energy_meter_lost", "warning",
                    {"meter": source, "error": why[:300],
                     "detail": "box energy per frame is estimated from CPU time from now on"})

    def tick(self, t_s: float, frames: int, cpu_s: Mapping[str, float | None]) -> None:
        """Close a window of `t_s` seconds with `frames` results and the stages' CPU."""
        meter_j = None
        if self._meter is not None:
            now = self._read()
            if now is not None and self._last_j is not None:
                delta = now - self._last_j
                why = meter_problem(delta, t_s)
                self._still = self._still + 1 if delta == 0 else 0
                if why is None and self._still >= STUCK_WINDOWS:
                    why = f"the meter did not move in {self._still} windows in a row"
                if why is not None:
                    self._drop(why)
                elif delta > 0:
                    meter_j = delta
            self._last_j = now
        self._windows.append(Window(t_s, frames, dict(cpu_s), meter_j))
        self._around = None

    def sample(self, now: float, frames: int, cpu_s: Mapping[str, float | None],
               publish_cpu: Callable[[], float | None]) -> None:
        """The control tick's call, with what the pipeline counted since the last one. A
        window closes once MIN_WINDOW_S has passed (an accelerated simulator ticks every few
        ms: no /proc or meter reads at that rate); `publish_cpu()` is then asked for the
        publisher thread's CPU total (None: no publisher, or it could not be read: publish
        is unmeasured in that window). The first call only starts a window."""
        self._pending_frames += frames
        for k, v in cpu_s.items():
            if v is not None:
                self._pending_cpu[k] = (self._pending_cpu.get(k) or 0.0) + v
            else:
                self._pending_cpu.setdefault(k, None)
        if self._t is not None and now - self._t < MIN_WINDOW_S:
            return
        prev_t, prev_pub = self._t, self._publish
        pub_total = publish_cpu()
        self._t, self._publish = now, pub_total
        n, cpu = self._pending_frames, self._pending_cpu
        self._pending_frames, self._pending_cpu = 0, {}
        if prev_t is None:
            if self._meter is not None:
                self._last_j = self._read()
            return
        pub = (pub_total - prev_pub if pub_total is not None and prev_pub is not None
               and pub_total >= prev_pub else None)
        self.tick(now - prev_t, n, {**cpu, "publish": pub})

    def around_j(self) -> float | None:
        """Joules a frame costs beyond inference and the idle floor (every measured stage but
        `infer`): what a rung's `other_j` adds to its power (power/rungs.py). None before a
        window with frames. Recomputed once per window, not per call (the control tick asks
        every tick; an accelerated simulator ticks every few ms)."""
        if self._around is None:
            r = self.report()
            stages = [v for k, v in r["stages_mj"].items() if k != MODEL_STAGE and v is not None]
            self._around = (sum(stages) / 1e3 if r["box_mj"] is not None and stages else None,)
        return self._around[0]

    def report(self) -> dict[str, Any]:
        """Energy per frame over the kept windows (`per_frame`), for health."""
        out = per_frame(list(self._windows), self.idle_w, self.w_per_cpu_s, self.source)
        if self.lost:
            out["meter_lost"] = self.lost
        return out
