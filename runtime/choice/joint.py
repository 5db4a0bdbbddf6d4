"""Several models, one budget: each model's per-inference target, and the box's joint ladder.

Pure (tables in tests/choice/test_joint.py). `runtime.frames.multisource` shares one model
between sources; this module is for sources that name different models (`[[sources]]
model`), and for tiled frames (a tiled frame costs one inference per tile).

- **Latency per stream, per model** (`targets`): every stream gets the same share of the box
  as with one model, `multisource.aggregate`'s per-frame target (n streams x latency within
  `latency_ms`; the combined rate within `UTILISATION_MAX` of the inference thread). A
  stream whose frames are cut into T tiles runs T inferences per frame, so its model's
  per-inference target is that frame target / T; a model serving several streams takes the
  strictest. Sum over the streams of T x per-inference target stays within both bounds, so
  every stream holds its target whatever mix of models runs.
- **Energy of the box** (`joint_ladder`): the box's dynamic power is the sum over models of
  (inferences per second of that model) x (energy per inference of its rung). The control
  step (power.control) climbs ONE ladder of rungs at the combined frame rate; with several
  models each of its rungs is a *combination* of the models' rungs. From every model on its
  top rung, the next rung down steps down the one model whose step saves the most watts per
  unit of accuracy lost (accuracy weighted by the frames that model inspects), until every
  model is on its cheapest rung; stepping up retraces the chain, undoing the last step down
  first. The chain is a list of ordinary `runtime.choice.ladders.Rung`s (energy per frame at the
  combined rate), so budget levels, the rung hold and the upgrade guard work unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from power.rungs import Rung
from runtime.frames.multisource import aggregate


@dataclass(frozen=True)
class Stream:
    """One source as the budget sees it: its model (a key) and its tiles per frame."""

    name: str
    model: str
    rate_hz: float
    tiles: int = 1


def targets(latency_ms: float, streams: Sequence[Stream]) -> dict[str, tuple[float, str]]:
    """Per model key: (per-inference latency target in ms, why) (see module doc)."""
    frame_ms, why = aggregate(latency_ms, [s.rate_hz for s in streams])
    out: dict[str, tuple[float, str]] = {}
    for s in streams:
        t = frame_ms / max(s.tiles, 1)
        if s.model in out and out[s.model][0] <= t:
            continue
        tiled = (f"source {s.name} cuts each frame into {s.tiles} tiles: each inference must "
                 f"take <= {t:.3g} ms ({frame_ms:.3g} ms per frame / {s.tiles})"
                 if s.tiles > 1 else "")
        out[s.model] = (t, "; ".join(x for x in (why, tiled) if x))
    return out


def per_frame(rungs: Sequence[Rung], tiles: float) -> list[Rung]:
    """Rungs per frame of `tiles` inferences (energy and latency x tiles): what the control
    step plans with when its rate counts frames. tiles = 1: the rungs themselves."""
    if tiles == 1:
        return list(rungs)
    return [replace(r, energy_j=r.energy_j * tiles, latency_s=r.latency_s * tiles)
            for r in rungs]


@dataclass(frozen=True)
class Load:
    """One model's part of the box: its ladder (cheapest first, energy per inference), the
    inferences per second its sources ask of it (rate x tiles, summed) and the frames per
    second it inspects (the weight of its accuracy)."""

    key: str
    rungs: tuple[Rung, ...]
    infer_hz: float
    frames_hz: float


@dataclass(frozen=True)
class JointRung:
    """A rung of the box: one rung index per model (in the order of the loads)."""

    picks: tuple[int, ...]
    rung: Rung  # what the control step sees: energy per frame at the combined frame rate
    up: str  # the model that steps up from this rung to the next ("": the top)


def power_w(loads: Sequence[Load], picks: Sequence[int]) -> float:
    """Dynamic power of the box with each model on its picked rung."""
    return sum(ld.rungs[i].power_w(ld.infer_hz) for ld, i in zip(loads, picks, strict=True))


def accuracy(loads: Sequence[Load], picks: Sequence[int]) -> float:
    """Accuracy of the box: each model's rung accuracy weighted by the frames it inspects."""
    frames = sum(ld.frames_hz for ld in loads)
    if frames <= 0:
        return min(ld.rungs[i].accuracy for ld, i in zip(loads, picks, strict=True))
    return sum(ld.rungs[i].accuracy * ld.frames_hz
               for ld, i in zip(loads, picks, strict=True)) / frames


def below(ld: Load, i: int) -> int | None:
    """The rung model `ld` steps down to from rung `i`: the richest rung under it that draws
    no more power (None: none does). Live energies can make a cheaper rung cost more than the
    one above it; stepping onto it would raise the box's power on a step *down*, so it is
    skipped (budget levels and the thermal policy rely on power falling as the rung falls)."""
    now = ld.rungs[i].power_w(ld.infer_hz)
    return next((j for j in range(i - 1, -1, -1)
                 if ld.rungs[j].power_w(ld.infer_hz) <= now), None)


def step_down(loads: Sequence[Load], picks: Sequence[int]) -> int | None:
    """Which model steps down next (its index), None when none can step down any more (each
    on its cheapest rung, or on one every rung under which draws more): the step saving the
    most watts per unit of box accuracy lost. A step that loses no accuracy is taken first
    (most watts first); one that saves nothing comes last."""
    best: tuple | None = None
    frames = sum(ld.frames_hz for ld in loads) or 1.0
    for m, (ld, i) in enumerate(zip(loads, picks, strict=True)):
        j = below(ld, i) if i > 0 else None
        if j is None:
            continue
        saved = ld.rungs[i].power_w(ld.infer_hz) - ld.rungs[j].power_w(ld.infer_hz)
        lost = max(ld.rungs[i].accuracy - ld.rungs[j].accuracy, 0.0) * ld.frames_hz / frames
        worth = math.inf if lost <= 1e-12 else saved / lost
        key = (saved > 0, worth, saved, ld.key)
        if best is None or key > best[0]:
            best = (key, m)
    return None if best is None else best[1]


def joint_ladder(loads: Sequence[Load], combined_hz: float) -> list[JointRung]:
    """The box's ladder, cheapest (every model on its cheapest rung, or the cheapest it can
    step down to without drawing more) to the top (every model on its selector's choice), as
    the greedy chain of the module doc: its power never rises from one rung to the next down.
    `combined_hz` is the frame rate the control step plans at: each rung's energy is per
    frame at that rate."""
    picks = [len(ld.rungs) - 1 for ld in loads]
    chain = [(tuple(picks), "")]
    while (m := step_down(loads, picks)) is not None:
        picks[m] = below(loads[m], picks[m])  # type: ignore[assignment]
        chain.append((tuple(picks), loads[m].key))
    chain.reverse()
    # reversed, entry k holds the model whose step down led to it from k + 1: the one
    # that steps up from k (the top's entry holds "")
    return [JointRung(p, _as_rung(loads, p, combined_hz), m) for p, m in chain]


def locate(ladder: Sequence[JointRung], running: Sequence[int]) -> tuple[int, bool]:
    """(index, on the ladder) of the models' running rungs. Live energies can reorder the
    chain so that what runs is on it no more: then the richest box rung that needs no model
    richer than now (0 if none), and False (the caller moves the models there)."""
    running = tuple(running)
    for k, j in enumerate(ladder):
        if j.picks == running:
            return k, True
    under = [k for k, j in enumerate(ladder)
             if all(a <= b for a, b in zip(j.picks, running, strict=True))]
    return max(under, default=0), False


def _as_rung(loads: Sequence[Load], picks: Sequence[int], combined_hz: float) -> Rung:
    """One box rung as a Rung at `combined_hz` frames per second: power / rate per frame,
    and the inference thread's busy time per frame (so it runs out at 100 % busy)."""
    rate = combined_hz if combined_hz > 0 else 1.0
    busy = sum(ld.rungs[i].latency_s * ld.infer_hz for ld, i in zip(loads, picks, strict=True))
    return Rung(variant_id=" + ".join(f"{ld.key}={ld.rungs[i].variant_id}"
                                      for ld, i in zip(loads, picks, strict=True)),
                accuracy=accuracy(loads, picks), energy_j=power_w(loads, picks) / rate,
                latency_s=max(busy / rate, 1e-9))


def describe(loads: Sequence[Load], ladder: Sequence[JointRung]) -> str:
    """One log line: each box rung's rung per model and its power."""
    return "; ".join(
        f"{k + 1}: " + ", ".join(f"{ld.key} {i + 1}/{len(ld.rungs)}"
                                 for ld, i in zip(loads, j.picks, strict=True))
        + f" {power_w(loads, j.picks):.3g} W acc {j.rung.accuracy:.3f}"
        for k, j in enumerate(ladder))


def planned_tiles(source: Any, manifest: Any) -> int:
    """Tiles per frame a source will cost before any frame came: known for a synthetic
    source (its size and ROI are in the config); 1 otherwise, until its frames tell
    (the daemon re-plans on the first frame whose tile count differs)."""
    if getattr(manifest, "detect", None) is None or getattr(manifest, "tiling", None) is None:
        return 1
    if source is None or source.kind != "synthetic":
        return 1
    from runtime.engine.tiling import tile_grid
    from runtime.frames.roi import resolve

    rect = resolve(source.roi, source.roi_units, source.size, source.size)
    hw = manifest.preprocess.hw(manifest.variants[0].input_shape)
    return len(tile_grid((rect.h, rect.w), hw, manifest.tiling))
