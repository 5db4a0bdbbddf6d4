"""Backend discovery: import each enabled engine; a missing one disables itself in one line.

Which engines exist, where each lives and the class of its knobs is the registry in
runtime/config/backends.py (`REGISTRY`, a leaf the config can read without importing any
engine): a built-in backend is built as `Class(knobs)` with its own `[backends.<name>]`
section, or `Class()` when it has none, as a plugin ("module:Class") is."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
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

# What to do about an engine that is missing, by why (a plugin: the generic line)
_NO_LIBRARY = {
    "onnxruntime": "pip install onnxruntime (a dependency of edgerun: reinstall edgerun)",
    "openvino": "pip install openvino (`edgerun install --without openvino` leaves it out)",
    "opencv": "pip install opencv-python-headless (a dependency of edgerun: reinstall edgerun)",
    "opencl": "pip install pyopencl, and on x86_64 pocl-binary-distribution (`edgerun install "
              "--without opencl` leaves them out)",
}
_NO_DEVICE = {
    "opencl": "install an OpenCL driver: on x86_64 `pip install pocl-binary-distribution` (a "
              "CPU driver), or the distribution's `apt install pocl-opencl-icd`, or the GPU "
              "vendor's ICD (a file in /etc/OpenCL/vendors) (docs/install.md, \"One OpenCL "
              "loader\")",
}
_PLUGIN = ("check the plugin's \"module:Class\" in [backends] plugins and that its package is "
           "installed")


@dataclass(frozen=True)
class EngineReport:
    """What discovery found of one engine: its devices, or why it is missing (the library
    absent, no device, failed to start) and what to do; with `probe`, the devices whose
    driver refused the engine's kernels, with why."""

    name: str
    devices: tuple[Device, ...] = ()
    missing: str = ""  # "" when found
    remedy: str = ""  # what to do about `missing`, or about the refused devices
    refused: tuple[tuple[str, str], ...] = ()  # (device id, why its driver refused)

    @property
    def found(self) -> bool:
        """Whether the engine is usable (on at least one device)."""
        return not self.missing


@dataclass(frozen=True)
class Discovery:
    """The engines built (what the daemon runs) and a report on every one it tried."""

    backends: list[Backend]
    engines: list[EngineReport]


def survey(cfg: BackendsConfig, probe: bool = False) -> Discovery:
    """Build every enabled backend whose library imports and which has a device, and report on
    each (found devices, or why missing and what to do). `probe`: also build each engine's
    kernels on its devices (`edgerun check`), naming the devices that refuse them."""
    # here, not at the top: importing the protocol (base.py, through this package) stays
    # free of the config package (tests/test_layering.py)
    from runtime.config.backends import BY_NAME

    found: list[Backend] = []
    reports: list[EngineReport] = []

    def missing(name: str, why: str, remedy: str) -> None:
        reports.append(EngineReport(name, missing=why, remedy=remedy))
        log.warning("backend %s disabled: %s; what to do: %s", name, why, remedy)

    specs = [(name, BY_NAME[name].backend) for name in cfg.enabled]
    specs += [(p, p) for p in cfg.plugins]
    for name, where in specs:
        install = _NO_LIBRARY.get(name, _PLUGIN)
        reinstall = install if name not in BY_NAME else f"reinstall it: {install}"
        module, cls = where.split(":")
        try:
            backend_cls = getattr(importlib.import_module(module), cls)
        except ImportError as e:  # the engine's library (or a plugin's module) is absent
            missing(name, f"library absent: {type(e).__name__}: {e}", install)
            continue
        except Exception as e:  # a library that fails as it loads, a plugin without the class
            missing(name, f"failed to start: {type(e).__name__}: {e}", reinstall)
            continue
        try:
            knobs = cfg.knobs(name)
            backend = backend_cls(knobs) if knobs is not None else backend_cls()
            devices = tuple(backend.devices())
        except Exception as e:  # a library that fails to initialise
            missing(name, f"failed to start: {type(e).__name__}: {e}", reinstall)
            continue
        if not devices:
            why = getattr(backend, "no_device", "") or "the library lists no usable device"
            missing(name, f"no device: {why}", _NO_DEVICE.get(name, reinstall))
            continue
        refused: dict[str, str] = backend.probe() if probe and hasattr(backend, "probe") \
            else {}
        reports.append(EngineReport(
            name, devices, refused=tuple(refused.items()),
            remedy=getattr(backend, "refused_hint", "") if refused else ""))
        found.append(backend)
    return Discovery(found, reports)


def discover(cfg: BackendsConfig) -> list[Backend]:
    """Instantiate every enabled backend whose library imports and which has a device."""
    return survey(cfg).backends


__all__ = ["Backend", "BackendError", "Device", "DeviceRefused", "Discovery", "EngineReport",
           "ModelFile", "Session", "Variant", "discover", "survey"]
