"""Measuring a model for the daemon: manifest, verified forms, a profile of every variant.

Changes no daemon state, so it can run on a background thread; the daemon installs the result
between control ticks. With `recorded` (the simulator's repeatable mode) the profiles are read
from a file written by `edgerun profile --json` or bench/record_ladder.py instead of measured:
the sessions are still real, only their measurements are replayed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from power.sensors import PowerMeter
from runtime.backends import Backend, Variant
from runtime.config import Config
from runtime.ladder import ladder_for
from runtime.manifest import Manifest, configured_model, model_files
from runtime.profiler import Profiler, default_threads, plan
from runtime.selector import Constraints, Profile

log = logging.getLogger("edgerun.measure")


@dataclass(frozen=True)
class Measured:
    """A model ready to install: its manifest, profiles and how to load each variant."""

    manifest: Manifest
    profiles: list[Profile]
    idle_w: float
    loaders: dict[str, tuple[Backend, Variant]]
    temp_c: float | None  # temperature while profiling (re-profile when it moves far)


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


def measure_model(path: Path, cfg: Config, backends: list[Backend], meter: PowerMeter,
                  device_name: str, active_w_per_core: float, temp_c: float | None,
                  on_refused: Callable[[str, str], None], progress: Callable[[int, int, str],
                                                                              None],
                  constraints: Constraints, fresh: bool = False,
                  recorded: Path | None = None) -> Measured:
    """Manifest, verified forms and their profiles (cached unless `fresh`). Raises
    NoVariantError before anything changes when nothing can run."""
    manifest = configured_model(path, cfg.model)
    if manifest.bare:
        v = manifest.variants[0]
        log.info("%s is a bare .onnx (no manifest): profiled as one fp32 form, input %s, "
                 "accuracy unknown (its fp32 form is the reference, 1.0), so the ladder has one "
                 "rung and the governor can only cap the frame rate; preprocess %s, output %s, "
                 "labels %s. `edgerun models prepare` makes a ladder with measured accuracy",
                 path, list(v.input_shape), manifest.preprocess.to_dict(), manifest.output,
                 ", ".join(manifest.labels[:5]) + (" ..." if len(manifest.labels) > 5 else "")
                 if manifest.labels else "class index")
    forms = model_files(manifest, lambda v, e: on_refused(v.name, str(e)))
    threads = cfg.backends.threads or default_threads()
    work = plan(backends, forms, threads, cfg.backends)
    profiler = Profiler(cfg.profiler, meter, device_name, active_w_per_core=active_w_per_core)
    replay = recorded_profiles(recorded) if recorded else None
    idle_w = profiler.idle_w()
    t0 = time.monotonic()
    profiles = []
    for i, (b, d, v) in enumerate(work, start=1):
        progress(i, len(work), manifest.name)
        if replay is not None:
            if v.id in replay:  # the accuracy is the manifest's now, not the recording's
                profiles.append(replace(replay[v.id], accuracy=v.model.accuracy))
            continue
        profiles.append(profiler.profile(b, d, v, fresh=fresh))
    log.info("%d variants of %s %s in %.1f s (%d failed)", len(profiles), manifest.name,
             "replayed from " + str(recorded) if replay is not None else "profiled",
             time.monotonic() - t0, sum(1 for p in profiles if not p.ok))
    ladder_for(profiles, constraints)  # raises NoVariantError before any change
    return Measured(manifest, profiles, idle_w, {v.id: (b, v) for b, _, v in work}, temp_c)
