"""Measuring a model for the daemon: manifest, verified forms, a profile of every variant.

With `[profiler] schedule = "fast"` (the default) in two steps: `measure_first` measures every
variant briefly and returns what to serve on now plus a `rest` that refines the candidates
(choice/refine.py) and returns the final profiles; the daemon runs `rest` in the background with
the pipeline's per-frame lock as its pause gate. `measure_model` does both at once.

Changes no daemon state, so it can run on a background thread; the daemon installs the result
between control ticks. With `recorded` (the simulator's repeatable mode) the profiles are read
from a file written by `edgerun profile --json` instead of measured:
the sessions are still real, only their measurements are replayed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from power.accelerators import AcceleratorPower
from power.nvml import NvmlMeter
from power.sensors import PowerMeter
from runtime.choice import hint_accuracy
from runtime.choice.ladders import ladder_for
from runtime.choice.profiler import (
    Profiler,
    Work,
    default_threads,
    log_failures,
    plan,
    quick_order,
    quick_pass,
    refine,
    to_refine,
)
from runtime.choice.refine import first_decision_ready
from runtime.choice.selector import Constraints, Profile
from runtime.config import Config
from runtime.engine.backends import Backend, Variant
from runtime.engine.manifest import Manifest, configured_model, model_files
from runtime.engine.model_meta import describe

log = logging.getLogger("edgerun.measure")


@dataclass(frozen=True)
class Measured:
    """A model ready to install: its manifest, profiles and how to load each variant."""

    manifest: Manifest
    profiles: list[Profile]
    idle_w: float
    loaders: dict[str, tuple[Backend, Variant]]
    temp_c: float | None  # temperature while profiling (re-profile when it moves far)
    # each GPU meter's idle floor (W, by its `where`) measured with the host's: what serving
    # bills an accelerator above (runtime/device/serving_drift.py)
    gpu_idle_w: dict[str, float] = field(default_factory=dict)


def recorded_profiles(path: Path) -> dict[str, Profile]:
    """Profiles by variant id from a JSON file: `edgerun profile --json` output (its
    "variants") or a plain list of profiles."""
    try:
        doc = json.loads(path.read_text())
        rows = doc["variants"] if isinstance(doc, dict) else doc
        names = {f.name for f in fields(Profile)}
        return {p.variant_id: p for p in (Profile(**{k: v for k, v in r.items() if k in names})
                                          for r in rows)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a recorded profile file ({e})") from e


def _profiled(profiles: list[Profile], name: str, t0: float) -> None:
    """The one line that closes every profiling schedule."""
    log.info("%d variants of %s profiled in %.1f s (%d failed, %d at full length)",
             len(profiles), name, time.monotonic() - t0, sum(1 for p in profiles if not p.ok),
             sum(1 for p in profiles if p.ok and p.stage == "full"))


Rest = Callable[[Callable[[], ContextManager] | None], Measured]


def measure_model(path: Path, cfg: Config, backends: list[Backend], meter: PowerMeter,
                  device_name: str, active_w_per_core: float, temp_c: float | None,
                  on_refused: Callable[[str, str], None], progress: Callable[[int, int, str],
                                                                              None],
                  constraints: Constraints, fresh: bool = False,
                  recorded: Path | None = None,
                  pause: Callable[[], ContextManager] | None = None,
                  accelerators: Sequence[AcceleratorPower] = (),
                  gpu_meters: Sequence[NvmlMeter] = ()) -> Measured:
    """Manifest, verified forms and their profiles (cached unless `fresh`), the whole
    schedule (`[profiler] schedule`) at once. Raises NoVariantError before anything changes
    when nothing can run."""
    first, rest = measure_first(path, cfg, backends, meter, device_name, active_w_per_core,
                                temp_c, on_refused, progress, constraints, fresh, recorded,
                                pause, accelerators=accelerators,
                                gpu_meters=gpu_meters)
    return rest(pause) if rest is not None else first


def _describe(path: Path, manifest: Manifest) -> None:
    """The log lines that say what is about to be measured: a bare .onnx's assumptions, the
    preprocessing and the labels, and where each came from."""
    if manifest.bare:
        v = manifest.variants[0]
        log.info("%s is a bare .onnx (no manifest): profiled as one fp32 form, input %s, "
                 "accuracy unknown (its fp32 form is the reference, 1.0), so the ladder has one "
                 "rung and the governor can only cap the frame rate; preprocess %s, output %s, "
                 "labels %s. `edgerun models prepare` makes a ladder with measured accuracy",
                 path, list(v.input_shape), manifest.preprocess.to_dict(), manifest.output,
                 ", ".join(manifest.labels[:5]) + (" ..." if len(manifest.labels) > 5 else "")
                 if manifest.labels else "class index")
    log.info("%s: preprocessing %s (from %s); labels: %d (from %s)", manifest.name,
             describe(manifest.preprocess.to_dict()), manifest.preprocess_source,
             len(manifest.labels), manifest.labels_source)


def _replayed(recorded: Path, work: Work, name: str,
              progress: Callable[[int, int, str], None]) -> list[Profile]:
    """The recorded profiles of the planned variants (the simulator's repeatable mode), each
    with the manifest's accuracy now, not the recording's."""
    replay = recorded_profiles(recorded)
    profiles = []
    for i, (_b, _d, v) in enumerate(work, start=1):
        progress(i, len(work), name)
        if v.id in replay:
            profiles.append(replace(replay[v.id], accuracy=v.model.accuracy))
    log.info("%d variants of %s replayed from %s", len(profiles), name, recorded)
    return profiles


def _exhaustive(work: Work, profiler: Profiler, fresh: bool, name: str,
                progress: Callable[[int, int, str], None]) -> list[Profile]:
    """Every variant at full length (`[profiler] schedule = "exhaustive"`)."""
    profiles = []
    for i, (b, d, v) in enumerate(work, start=1):
        progress(i, len(work), name)
        profiles.append(profiler.profile(b, d, v, fresh=fresh, retry_failed=False))
    log_failures(profiles)
    return profiles


def measure_first(path: Path, cfg: Config, backends: list[Backend], meter: PowerMeter,
                  device_name: str, active_w_per_core: float, temp_c: float | None,
                  on_refused: Callable[[str, str], None], progress: Callable[[int, int, str],
                                                                              None],
                  constraints: Constraints, fresh: bool = False,
                  recorded: Path | None = None,
                  pause: Callable[[], ContextManager] | None = None,
                  accelerators: Sequence[AcceleratorPower] = (),
                  gpu_meters: Sequence[NvmlMeter] = ()
                  ) -> tuple[Measured, Rest | None]:
    """The first decision: with the fast schedule, every variant measured briefly (or read
    from the cache) and a `rest(pause)` that refines the candidates and returns the final
    Measured (None when nothing is left to refine: a warm cache, the exhaustive schedule, a
    recording). Raises NoVariantError before anything changes when nothing can run."""
    manifest = configured_model(path, cfg.model)
    _describe(path, manifest)
    forms = model_files(manifest, lambda v, e: on_refused(v.name, str(e)))
    threads = cfg.backends.threads or default_threads()
    # an engine's own lower precision (OpenVINO bf16/f16, OpenCV fp16) is measured through it
    # on the ladder's eval images first, or left out of the choice
    work = hint_accuracy.apply(plan(backends, forms, threads, cfg.backends), manifest,
                               cfg.profiler.cache_path(), fresh)
    profiler = Profiler(cfg.profiler, meter, device_name, active_w_per_core=active_w_per_core,
                        accelerators=accelerators, gpu_meters=gpu_meters)
    loaders = {v.id: (b, v) for b, _, v in work}
    idle_w = profiler.idle_w()
    gpu_idle = profiler.gpu_idle_w()
    t0 = time.monotonic()
    if recorded is not None or cfg.profiler.schedule == "exhaustive":
        if recorded is not None:
            profiles = _replayed(recorded, work, manifest.name, progress)
        else:
            profiles = _exhaustive(work, profiler, fresh, manifest.name, progress)
            _profiled(profiles, manifest.name, t0)
        ladder_for(profiles, constraints)  # raises NoVariantError before any change
        return Measured(manifest, profiles, idle_w, loaders, temp_c, gpu_idle), None
    return _fast(work, profiler, manifest,
                 Measured(manifest, [], idle_w, loaders, temp_c, gpu_idle),
                 constraints, fresh, progress, pause, cfg.profiler.first_decision_s, t0)


def _fast(work: Work, profiler: Profiler, manifest: Manifest, base: Measured,
          constraints: Constraints, fresh: bool, progress: Callable[[int, int, str], None],
          pause: Callable[[], ContextManager] | None, first_decision_s: float,
          t0: float) -> tuple[Measured, Rest | None]:
    """The fast schedule (see `measure_first`): the quick round, the first decision, and the
    refinement left to `rest` unless the cache says it already ran to the end."""
    forms_names = sorted({v.model.name for _, _, v in work})
    quick, hits, later = quick_pass(
        quick_order(work), profiler, fresh,
        lambda i, n, _vid: progress(i, n, f"{manifest.name} (quick round)"), pause,
        enough=lambda ps: first_decision_ready(ps, forms_names, constraints,
                                               time.monotonic() - t0, first_decision_s))
    _, reason = ladder_for(quick, constraints)  # raises NoVariantError before any change
    first = replace(base, profiles=quick)
    pending = len(later) + to_refine(quick, constraints)
    done_key = profiler.refined_key(work, constraints)
    # Every profile from the cache and a refinement against these constraints ran to the end
    # on them: running it again would re-measure the near-ties at full length on every start,
    # on the CPU the frames need, for the same result.
    refined_before = pending and not fresh and hits == len(work) and profiler.refined(done_key)
    log.info("first choice for %s after %.1f s (%d of %d variants: %d measured briefly, %d "
             "from the cache): %s%s", manifest.name, time.monotonic() - t0, len(quick),
             len(work), len(quick) - hits, hits, reason,
             "; final (refined on an earlier start)" if refined_before
             else f"; {len(later)} more to measure briefly and the candidates to refine next"
             if later else f"; refining {pending} candidates next" if pending else "; final")
    if not pending or refined_before:
        _profiled(quick, manifest.name, t0)
        return first, None

    def rest(gate: Callable[[], ContextManager] | None) -> Measured:
        t1 = time.monotonic()
        more, _, _ = quick_pass(later, profiler, fresh,
                                lambda i, n, _vid: progress(i, n, f"{manifest.name} (quick "
                                                            "round, background)"), gate)
        final = refine(work, quick + more, profiler, constraints,
                       lambda i, n, _vid: progress(i, n, f"{manifest.name} (refining)"), gate)
        _, why = ladder_for(final, constraints)
        log.info("refinement of %s finished in %.1f s (%d variants measured at full length, "
                 "%d pruned after a shorter round): %s", manifest.name, time.monotonic() - t1,
                 sum(1 for p in final if p.ok and p.stage == "full"),
                 sum(1 for p in final if p.ok and p.stage != "full"), why)
        _profiled(final, manifest.name, t0)
        profiler.mark_refined(done_key)
        return replace(base, profiles=final)

    return first, rest
