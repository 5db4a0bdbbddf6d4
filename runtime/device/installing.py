"""Models measured and installed (main loop, but `measure` on the reprofile thread too): the
engines and the first model at start-up, each source's own model, a measurement made current
and its preprocessing chosen, and the installs the background threads queue."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.choice.measure import measure_first, measure_model
from runtime.device import ladders
from runtime.device.host import Stopping
from runtime.device.profiling import progress_reporter
from runtime.device.served_model import ServedModel, preprocess_chooser
from runtime.device.source_plan import bundled_model
from runtime.engine.backends import discover

if TYPE_CHECKING:
    from runtime.choice.measure import Measured
    from runtime.device.host import PartsHost

log = logging.getLogger("edgerun.daemon")  # one logger for all the daemon's parts


def measure(d: PartsHost, path: Path, fresh: bool = False, first_only: bool = False,
            key: str = "", section: Any = None) -> Any:
    """The whole profiling schedule (a Measured), measured between the pipeline's frames
    once it runs; or, with `first_only`, measure_first's (first Measured, rest or None).
    `key`/`section`: a source's own model (its target and its [model]-like section)."""
    cfg = d.cfg if section is None else replace(d.cfg, model=section)
    recorded = Path(cfg.simulator.profiles) if (cfg.simulator.enabled
                                                and cfg.simulator.profiles) else None
    args = (path, cfg, d.backends, d.meter, d.device.name,
            d.device.power.active_w_per_core, d.sensors.read().temp_c,
            lambda v, e: variant_refused(d, v, e), progress_reporter(d.notify, d.stopping),
            ladders.constraints(d, key), fresh,
            recorded)
    billing = {"accelerators": d.device.accelerators, "gpu_meters": d.gpu_meters}
    if first_only:
        return measure_first(*args, **billing)
    return measure_model(*args, pause=d.pipeline.exclusive if d.pipeline else None,
                         **billing)


def variant_refused(d: PartsHost, variant: str, error: str) -> None:
    """A variant that would not run: the others serve (an error line, a critical event)."""
    log.error("variant %s refused: %s; running on the others", variant, error)
    d.event("variant_refused", "critical", variant=variant, error=error)


def install(d: PartsHost, m: Measured, ladder: bool = True) -> None:
    """Make measured profiles current (main thread only) and rebuild the ladder (`ladder`
    False: the caller builds it, at start-up once the sources' own models are in)."""
    old = d.box.model.manifest
    if old is not None and Path(m.manifest.root) != Path(old.root):
        d.model_gen += 1  # profiles of the model before are stale from now on
    d.box.model.install(m)
    d.energy.forget_model()  # the sources' own models did not change
    if ladder:
        ladders.build(d)
    if d.pipeline is not None:  # a new model brings its own preprocessing to measure
        # (another version with the same preprocessing keeps the measured choice: measuring
        # again runs 21 preprocessings inline on the first frame after the swap)
        d.pipeline.set_manifest(d.box.model.manifest, d.box.model.pre if (
            old is not None and old.preprocess == d.box.model.manifest.preprocess)
            else new_preprocess_chooser(d))


def install_source_models(d: PartsHost) -> None:
    """Measure the models `[[sources]]` name (once each; cached like the [model]'s), plan
    every source's tiles and build the ladders (start-up, before the pipeline runs)."""
    for s in d.cfg.sources:
        key = d.plan.model_key(s)
        if not key or key in d.box.source_models or key in d.plan.failed:
            continue
        sm = ServedModel.of_source(key, s, d.cfg.model)
        log.info("source %s: model %s (%s)", s.name, key, sm.path)
        try:
            sm.install(measure(d, sm.path, key=key, section=sm.section))
        except Stopping:
            raise
        except Exception as e:  # a corrupt or unusable model costs its sources only
            source_model_failed(d, key, sm.path, e)
            continue
        d.box.source_models[key] = sm
    d.plan.plan_tiles({k: m.manifest for k, m in d.box.source_models.items()},
                      d.box.model.manifest)
    ladders.build(d)


def source_model_failed(d: PartsHost, key: str, path: Path, e: Exception) -> None:
    """A source's own model cannot be used (corrupt, unreadable, no variant runs): its
    sources are not inspected, the daemon and the other sources run on (an error line and
    a critical `source_model_failed` event, and those sources' health says failed)."""
    names, why = d.plan.model_failed(key, path, e)
    log.error("source%s %s not inspected: %s; the other sources run (fix the model and "
              "restart)", "s" if len(names) > 1 else "", ", ".join(names), why)
    d.event("source_model_failed", "critical", model=key[-256:], sources=names, error=why)


def new_preprocess_chooser(d: PartsHost) -> Any:
    """A new preprocessing choice for the [model] (CPU or OpenCL, measured per size)."""
    m = d.box.model
    m.pre = preprocess_chooser(d.backends, m.manifest, d.meter, m.idle_w, m.pre_paths)
    return m.pre


def apply_installs(d: PartsHost) -> None:
    """Install what the background threads measured (the main loop's turn)."""
    while True:
        try:
            job = d.installs.get_nowait()
        except queue.Empty:
            return
        if job.version:  # a new model version: pointer switch, swap, probation
            d.ota.apply(job.measured, job.why, job.version)
        elif job.gen is not None and job.gen != d.model_gen:  # began before a swap
            log.info("%s: dropped, it profiled %s and another model was installed "
                     "since it began", job.why, job.measured.manifest.name)
        else:
            d.install_model(job.measured, job.why)


def install_models(d: PartsHost) -> Callable | None:
    """The engines (discovered once per process), the [model]'s model (the version OTA
    serves) measured on the first schedule, and each source's own model; returns the rest
    of the [model]'s schedule (to refine in the background) or None."""
    cfg = d.cfg
    path = d.ota.model_path(Path(cfg.model.path) if cfg.model.path else bundled_model())
    # Engines are discovered once per process: re-creating them (a second ov.Core while the
    # first is torn down) was seen to leave the process crashing on its next signal.
    d.backends = discover(cfg.backends)
    d.devices = [{"backend": b.name, "id": dev.id, "name": dev.name, **dev.details}
                 for b in d.backends for dev in b.devices()]  # fixed for the process
    first, rest = d.ota.first_model(
        path, lambda p: measure(d, p, first_only=True))
    # one ladder, built once every model is in: building it here too logged the start-up
    # `choice:` line twice
    install(d, first, ladder=False)
    install_source_models(d)
    return rest


def install_model(d: PartsHost, measured: Measured, why: str) -> float:
    """Install a measured [model] and go to its top rung, or stay down
    (ladders.after_rebuild); the seconds the ladder took (the rest loaded and warmed the
    session)."""
    held = d.box.held_down()
    t0 = time.perf_counter()
    install(d, measured)
    took = time.perf_counter() - t0
    ladders.after_rebuild(d, why, held)
    return took


def load_in_background(d: PartsHost, path: Path, fresh: bool, why: str,
                       wait: bool = False) -> None:
    """Profile `path` on the reprofile thread (runtime.device.profiling); the main loop
    installs the result between ticks. `wait`: after the profiling under way."""
    d.profiler.load(lambda: measure(d, path, fresh), why, d.model_gen, wait)
