"""The small protocol every inference backend implements, and the nouns it speaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # a name in signatures only: the protocol file imports no project module
    from runtime.config.backends import BackendsConfig


class BackendError(RuntimeError):
    """A backend could not load or run a model; the message names model, backend and cause."""

    def __init__(self, backend: str, model: Path | str, cause: str):
        super().__init__(f"{backend} cannot run {model}: {cause}")
        self.backend, self.model, self.cause = backend, str(model), cause


class DeviceRefused(BackendError):
    """The device cannot run the engine at all (its driver refused to build the engine's
    kernels): every variant on it fails alike, whatever the model, so the profiler records it
    as refused, not as the model's failure. `cause` names the device and the driver's reason."""

    def __init__(self, backend: str, model: Path | str, device: str, cause: str):
        super().__init__(backend, model, cause)
        self.device = device
        if not model:  # refused before any model asked for it (a probe, the preprocessor)
            self.args = (f"{backend}: {cause}",)


@dataclass(frozen=True)
class Device:
    """One device a backend can run on."""

    backend: str
    id: str  # what the variant id uses: "CPU", "GPU.0", ...
    name: str  # human name, e.g. the CPU model
    details: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ModelFile:
    """One precision form of a model on disk, with its input fixed."""

    name: str  # model name, e.g. "inspection"
    precision: str  # fp32 | fp16 | int8 | a smaller-model tag
    path: Path
    input_name: str
    input_shape: tuple[int, ...]
    accuracy: float | None = None  # from the ladder manifest; None without one


@dataclass(frozen=True)
class Variant:
    """One runnable form: (model, precision, engine, device, threads, options)."""

    model: ModelFile
    precision: str  # effective math precision (a precision hint can lower the file's)
    engine: str
    device: str
    threads: int  # 0 = the engine's default
    options: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """Readable id, e.g. `inspection/int8@openvino:CPU/t1` (+ options)."""
        t = f"t{self.threads}" if self.threads else "tdefault"
        base = f"{self.model.name}/{self.precision}@{self.engine}:{self.device}/{t}"
        if self.options:
            base += "," + ",".join(f"{k}={v}" for k, v in self.options)
        return base

    def option(self, key: str, default: str = "") -> str:
        """One option's value."""
        return dict(self.options).get(key, default)


class Session(Protocol):
    """A loaded variant, ready to run."""

    actual_device: str  # what really runs it: no silent CPU fallback goes unreported

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch, return the first output."""
        ...

    def close(self) -> None:
        """Release the engine's resources."""
        ...


class Backend(Protocol):
    """One inference engine. A built-in one is listed in runtime/config/backends.py
    (`REGISTRY`: name, "module:Class", knobs class), which its `name` and `config_class`
    repeat (tests/config/test_config.py holds them to it); `discover` builds it as
    `Class(knobs)` with its `[backends.<name>]` section, or `Class()` when it has none."""

    name: str
    config_class: type | None  # the dataclass of [backends.<name>]; None: no knobs

    def devices(self) -> list[Device]:
        """Devices this engine can use here; never raises for missing hardware."""
        ...

    def variants(self, model: ModelFile, cfg: BackendsConfig,
                 threads: tuple[int, ...]) -> list[Variant]:
        """Every variant of `model` worth profiling on this engine's devices."""
        ...

    def load(self, variant: Variant) -> Session:
        """Load a variant; failures raise BackendError."""
        ...


_NOISE = ("Exception from src/", "Check 'false' failed", "FrontEnd API failed",
          "[ONNXRuntimeError]")


def summarize_error(e: BaseException, limit: int = 400) -> str:
    """An engine's exception as one readable line: source-file prefixes and banners dropped."""
    import re

    lines = []
    for raw in str(e).splitlines():
        line = re.sub(r"OpenCV\([\d.]+\) \S+:\d+: error: ", "", raw.strip()).lstrip("> ")
        line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
        if line and not line.startswith(_NOISE):
            lines.append(line)
    text = " ".join(lines) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
