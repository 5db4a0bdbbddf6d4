"""What one frame costs the box in each configuration, from measured parts. Pure.

The selector (runtime/choice/selector.py) used to rank variants by the model's energy per
inference and judge them on inference latency alone. A frame costs the box more: capture,
decoding, cropping, preprocessing, inference, building the result, persisting and publishing
it (power/box_energy.py accounts every stage of the running pipeline), plus the share of the
box's idle floor that the frame rate implies. Here a *configuration* is a variant (engine,
precision, threads: a Profile) together with the pipeline's own choice for it, the
preprocessing path (CPU, or OpenCL where a device has it) for its input size, and:

    box mJ/frame  = tiles x (model mJ + preprocess mJ) + other stages mJ + idle share
    idle share    = idle W / the frame rate (the offered rate, or what the configuration
                    sustains when that is less; rate 0, a backlog: what it sustains)
    sustained     = 1000 / the slowest thread's ms per frame (capture with decode and crop,
                    preprocessing, and inference with postprocess and persist run on their
                    own threads: they overlap), and no more than the cores allow for the
                    sum of the three
    end to end    = other stages ms + tiles x (preprocess ms + inference ms at the percentile)

The pipeline's other choices are not traded for energy: tiling is the operator's (`[model]
tiling`: it decides which objects a detector can see), so it enters as the tiles per frame
it costs; the sources decode every frame at full size (there is no decode-size choice to
make, runtime/frames/images.py); the reduced-resolution variants are the ladder's own
(their smaller input makes preprocessing and inference cheaper, measured per variant).

A part nobody measured (the other stages before the first frames, a form's preprocessing
before its first frame) is None in the figure and named in `unmeasured`, never 0: the box
figure is then the sum of what was measured, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Measured(Protocol):
    """What a figure needs of a profile (runtime.choice.selector.Profile)."""

    variant_id: str
    energy_mj: float
    p50_ms: float

    def latency(self, percentile: int) -> float:
        """Inference latency in ms at the percentile."""
        ...


@dataclass(frozen=True)
class PrePath:
    """One way to make a form's input tensor from a frame (or a tile), as measured."""

    name: str  # cpu | opencl:<device>
    mj: float  # energy per tensor
    ms: float  # wall time per tensor


@dataclass(frozen=True)
class FrameCosts:
    """The measured cost of the stages around inference, and the rate frames come at."""

    idle_w: float  # the box's idle floor
    rate_hz: float  # frames offered per second; 0: a backlog (as fast as it sustains)
    other_mj: float | None = None  # per frame: capture, decode, crop, postprocess, persist,
    # publish (power/box_energy.py's stages but infer and preprocess); None: not measured yet
    other_ms: float | None = None  # the latency they add to a frame at the percentile
    # by variant id: the paths measured for its input size (the caller maps each variant to
    # its input shape: forms of one model share a name, not a size)
    pre: Mapping[str, tuple[PrePath, ...]] = field(default_factory=dict)
    tiles: int = 1  # inferences per frame ([model] tiling)
    source: str = "estimated"  # of the energies: estimated | rapl | hwmon | ...
    # per frame, for the rate a backlog is cleared at: the capture thread's time (read,
    # decode, crop) and what the inference thread runs besides inference (postprocess,
    # persist); 0: not known, left out of the bound
    capture_ms: float = 0.0
    store_ms: float = 0.0
    cores: float = math.inf  # CPUs the stages share; inf: no bound from their sum


@dataclass(frozen=True)
class BoxFigure:
    """One configuration's cost per frame (mJ) and its latencies (ms)."""

    variant_id: str
    pre_path: str  # "" when no path was measured for its form
    box_mj: float  # what was measured of the sum (see `unmeasured`)
    model_mj: float  # tiles x energy per inference
    pre_mj: float | None
    other_mj: float | None
    idle_mj: float
    rate_hz: float  # the frame rate the idle share is taken at
    infer_ms: float  # tiles x inference at the percentile (the reported figure)
    e2e_ms: float  # other stages + tiles x (preprocess + inference), of what was measured
    unmeasured: tuple[str, ...] = ()  # parts missing from box_mj and e2e_ms


def sustained_hz(infer_ms: float, pre_ms: float | None, costs: FrameCosts) -> float:
    """Frames per second the slowest thread allows (stages on their own threads overlap),
    and the cores allow for all of them together (see module doc)."""
    threads = (infer_ms + costs.store_ms, pre_ms or 0.0, costs.capture_ms)
    slowest = max(threads)
    rate = 1000.0 / slowest if slowest > 0 else math.inf
    if math.isfinite(costs.cores) and sum(threads) > 0:
        rate = min(rate, costs.cores * 1000.0 / sum(threads))
    return rate


def figure(p: Measured, costs: FrameCosts, percentile: int,
           path: PrePath | None = None) -> BoxFigure:
    """The cost per frame of running `p` with preprocessing `path` (None: the form's cheapest
    measured path, or unmeasured when it has none) under `costs` (see module doc)."""
    tiles = max(costs.tiles, 1)
    if path is None:
        path = cheapest(costs.pre.get(p.variant_id, ()))
    unmeasured = []
    if path is None:
        unmeasured.append("preprocess")
    if costs.other_mj is None or costs.other_ms is None:
        unmeasured.append("other stages")
    model_mj = tiles * p.energy_mj
    pre_mj = tiles * path.mj if path is not None else None
    pre_ms = tiles * path.ms if path is not None else None
    infer_ms = tiles * p.latency(percentile)
    rate = sustained_hz(tiles * p.p50_ms, pre_ms, costs)
    if costs.rate_hz > 0:
        rate = min(rate, costs.rate_hz)
    idle_mj = costs.idle_w / rate * 1e3 if rate > 0 and math.isfinite(rate) else 0.0
    box = model_mj + (pre_mj or 0.0) + (costs.other_mj or 0.0) + idle_mj
    e2e = infer_ms + (pre_ms or 0.0) + (costs.other_ms or 0.0)
    return BoxFigure(p.variant_id, path.name if path is not None else "", box, model_mj,
                     pre_mj, costs.other_mj, idle_mj, rate, infer_ms, e2e, tuple(unmeasured))


def cheapest(paths: Sequence[PrePath]) -> PrePath | None:
    """The path with the least energy per tensor, ties by time then name (None: none)."""
    return min(paths, key=lambda q: (round(q.mj, 4), q.ms, q.name), default=None)


def configurations(p: Measured, costs: FrameCosts, percentile: int) -> list[BoxFigure]:
    """Every configuration of `p`: one per preprocessing path measured for its input (one
    with preprocessing unmeasured when none was)."""
    paths = costs.pre.get(p.variant_id, ())
    return [figure(p, costs, percentile, q) for q in paths] or [figure(p, costs, percentile)]


def energy_key(f: BoxFigure) -> float:
    """Box energy rounded so that sub-microjoule noise is a tie (latency breaks it)."""
    return round(f.box_mj, 4) if not math.isnan(f.box_mj) else math.inf


def describe(f: BoxFigure, costs: FrameCosts) -> str:
    """One line: the box's energy per frame and its parts, the latencies, what is missing."""
    parts = [f"model {f.model_mj:.3f}"]
    if f.pre_mj is not None:
        parts.append(f"preprocess {f.pre_mj:.3f} ({f.pre_path})")
    if f.other_mj is not None:
        parts.append(f"other stages {f.other_mj:.3f}")
    parts.append(f"idle share {f.idle_mj:.3f} at {f.rate_hz:.3g} Hz")
    missing = f"; not measured yet: {', '.join(f.unmeasured)}" if f.unmeasured else ""
    return (f"{f.box_mj:.3f} mJ/frame box ({', '.join(parts)}; {costs.source}), end to end "
            f"{f.e2e_ms:.2f} ms, inference {f.infer_ms:.2f} ms{missing}")


# the box's stages (power/box_energy.py STAGES) that run whatever the configuration: the
# frame's read, decode and crop before, and its result built, persisted and published after
AROUND = ("capture", "decode", "crop", "postprocess", "persist", "publish")


def live_costs(report: Mapping[str, Any] | None, pre_report: Mapping[str, Sequence[Mapping]],
               shapes: Mapping[str, tuple[int, ...]], idle_w: float, rate_hz: float,
               tiles: int = 1, e2e_p95_ms: float | None = None,
               infer_p95_ms: float | None = None, running: str = "") -> FrameCosts:
    """FrameCosts from what a serving daemon measured: `report` is power/box_energy.py's
    per-frame report (None, or no box figure yet: the other stages unmeasured); `pre_report`
    the preprocessing chooser's (runtime.engine.preprocessing.PreprocessChooser.report:
    "WxH->wxh" -> the paths measured, ms and mJ per tensor); `shapes` each variant's input
    shape (its paths are those measured for its input size); the end-to-end and inference
    p95 per frame of the frames served on variant `running` (the other stages' latency is
    what end to end adds to its inference and preprocessing; None: unmeasured). Pure."""
    other_mj: float | None = None
    if report is not None and report.get("box_mj") is not None:
        stages = report.get("stages_mj") or {}
        # a stage without counters (decode inside a camera's read, publish without a broker)
        # is in another stage's figure or not run: left out, not counted as 0 work
        known = [stages.get(s) for s in AROUND if stages.get(s) is not None]
        other_mj = float(sum(known)) if known else None
    by_size: dict[str, tuple[PrePath, ...]] = {}
    used: dict[str, PrePath] = {}  # by size: the path the chooser runs (its chosen row)
    for label, rows in pre_report.items():
        size = label.rsplit("->", 1)[-1]
        by_size[size] = tuple(PrePath(str(r["path"]), float(r["mj"]), float(r["ms"]))
                              for r in rows)
        chosen = [q for q, r in zip(by_size[size], rows, strict=True) if r.get("chosen")]
        if chosen:
            used[size] = chosen[0]
    pre = {vid: by_size[_size(s)] for vid, s in shapes.items() if _size(s) in by_size}
    other_ms: float | None = None
    if e2e_p95_ms is not None and infer_p95_ms is not None:
        # the path the running variant's frames were preprocessed on (the cheapest when the
        # report marks none), so that the other stages are what is left of end to end
        s = shapes.get(running, ())
        path = used.get(_size(s)) or cheapest(pre.get(running, ()))
        other_ms = max(e2e_p95_ms - infer_p95_ms - tiles * (path.ms if path else 0.0), 0.0)
    return FrameCosts(idle_w=idle_w, rate_hz=rate_hz, other_mj=other_mj, other_ms=other_ms,
                      pre=pre, tiles=tiles,
                      source=str(report.get("source", "estimated")) if report else "estimated")


def _size(shape: Sequence[int]) -> str:
    """An input shape as the preprocessing report names its size (WxH; "" when not 2-D)."""
    return f"{shape[-1]}x{shape[-2]}" if len(shape) >= 2 else ""
