"""Backend discovery: import each enabled engine; a missing one disables itself in one line."""

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

# engine name -> (module, class)
REGISTRY = {
    "onnxruntime": ("runtime.engine.backends.onnxruntime", "OnnxRuntimeBackend"),
    "openvino": ("runtime.engine.backends.openvino", "OpenVinoBackend"),
    "opencv": ("runtime.engine.backends.opencv", "OpenCvBackend"),
    "opencl": ("runtime.engine.backends.opencl", "OpenClBackend"),
}


def discover(cfg: BackendsConfig) -> list[Backend]:
    """Instantiate every enabled backend whose library imports and which has a device."""
    found: list[Backend] = []
    specs = [(name, *REGISTRY[name]) for name in cfg.enabled]
    specs += [(p, *p.split(":")) for p in cfg.plugins]
    for name, module, cls in specs:
        try:
            backend_cls = getattr(importlib.import_module(module), cls)
            backend = (backend_cls(cfg.openvino.cache_dir) if name == "openvino"
                       else backend_cls())
            if not backend.devices():
                log.warning("backend %s disabled: it reports no usable device", name)
                continue
        except Exception as e:  # ImportError, or a library that fails to initialise
            log.warning("backend %s disabled: %s: %s", name, type(e).__name__, e)
            continue
        found.append(backend)
    return found


__all__ = ["REGISTRY", "Backend", "BackendError", "Device", "DeviceRefused", "ModelFile",
           "Session", "Variant", "discover"]
