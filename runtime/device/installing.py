"""The models installed at start-up: the engines, the [model]'s first measurement (the version
OTA serves) and each source's own model. Measuring and installing while serving are
`Serving`'s (runtime/device/serving.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.device.profiling import Stopping
from runtime.device.served_model import ServedModel
from runtime.device.source_plan import bundled_model

if TYPE_CHECKING:
    from runtime.device.serving import Serving

log = logging.getLogger("edgerun.daemon")  # one logger for all the daemon's parts


def install_models(s: Serving, ota: Any) -> Callable | None:
    """The engines (discovered once per process), the [model]'s model (the version `ota`,
    runtime.device.ota.DeviceOta, serves) measured on the first schedule, and each source's
    own model; returns the rest of the [model]'s schedule (to refine in the background) or
    None."""
    cfg = s.cfg
    path = ota.model_path(Path(cfg.model.path) if cfg.model.path else bundled_model())
    s.discover_engines()
    first, rest = ota.first_model(path, lambda p: s.measure(p, first_only=True))
    # one ladder, built once every model is in: building it here too logged the start-up
    # `choice:` line twice
    s.install(first, ladder=False)
    install_source_models(s)
    return rest


def install_source_models(s: Serving) -> None:
    """Measure the models `[[sources]]` name (once each; cached like the [model]'s), plan
    every source's tiles and build the ladders (start-up, before the pipeline runs)."""
    for src in s.cfg.sources:
        key = s.plan.model_key(src)
        if not key or key in s.box.source_models or key in s.plan.failed:
            continue
        sm = ServedModel.of_source(key, src, s.cfg.model)
        log.info("source %s: model %s (%s)", src.name, key, sm.path)
        try:
            sm.install(s.measure(sm.path, key=key, section=sm.section))
        except Stopping:
            raise
        except Exception as e:  # a corrupt or unusable model costs its sources only
            source_model_failed(s, key, sm.path, e)
            continue
        s.box.source_models[key] = sm
    s.plan.plan_tiles({k: m.manifest for k, m in s.box.source_models.items()},
                      s.box.model.manifest)
    s.build()


def source_model_failed(s: Serving, key: str, path: Path, e: Exception) -> None:
    """A source's own model cannot be used (corrupt, unreadable, no variant runs): its
    sources are not inspected, the daemon and the other sources run on (an error line and
    a critical `source_model_failed` event, and those sources' health says failed)."""
    names, why = s.plan.model_failed(key, path, e)
    log.error("source%s %s not inspected: %s; the other sources run (fix the model and "
              "restart)", "s" if len(names) > 1 else "", ", ".join(names), why)
    s.event("source_model_failed", "critical", model=key[-256:], sources=names, error=why)
