"""Backend discovery: import each enabled engine; a missing one disables itself in one line.

Which engines exist, where each lives and the class of its knobs is the registry in
runtime/config/backends.py (`REGISTRY`, a leaf the config can read without importing any
engine): a built-in backend is built as `Class(knobs)` with its own `[backends.<name>]`
section, or `Class()` when it has none, as a plugin ("module:Class") is."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from runtime.engine.backends.base import (
    Backend,
    BackendError,
    Device,
    DeviceRefused,
    ModelFile,
    Session,
    Variant,
)

if TYPE_CHECKING:  # annotations only: importing the protocol loads no config
    from runtime.config.backends import BackendsConfig

log = logging.getLogger(__name__)

def discover(cfg: BackendsConfig) -> list[Backend]:
    """Instantiate every enabled backend whose library imports and which has a device."""
    # here, not at the top: importing the protocol (base.py, through this package) stays
    # free of the config package (tests/test_layering.py)
    from runtime.config.backends import BY_NAME

    found: list[Backend] = []
    specs = [(name, BY_NAME[name].backend) for name in cfg.enabled]
    specs += [(p, p) for p in cfg.plugins]
    for name, where in specs:
        module, cls = where.split(":")
        try:
            backend_cls = getattr(importlib.import_module(module), cls)
            knobs = cfg.knobs(name)
            backend = backend_cls(knobs) if knobs is not None else backend_cls()
            if not backend.devices():
                log.warning("backend %s disabled: it reports no usable device", name)
                continue
        except Exception as e:  # ImportError, or a library that fails to initialise
            log.warning("backend %s disabled: %s: %s", name, type(e).__name__, e)
            continue
        found.append(backend)
    return found


__all__ = ["Backend", "BackendError", "Device", "DeviceRefused", "ModelFile",
           "Session", "Variant", "discover"]
