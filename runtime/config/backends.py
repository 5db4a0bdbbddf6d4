"""The `[backends]` section: which engines to try, the shared thread axis, and each engine's
own knobs (`[backends.<engine>]`).

`REGISTRY` is the one list of built-in engines: a name (what `enabled` accepts and what
`[backends.<name>]` is called), where its backend class lives, and the class of its knobs (none
for an engine without any). `BackendsConfig`'s per-engine sections and the `enabled` check
are derived from it, and `runtime.engine.backends.discover` imports the backends it names.
The knob classes live here, not in the backends' files, because the config is a leaf
(tests/test_layering.py): reading a config must not import onnxruntime, OpenVINO, cv2 or
pyopencl. Each backend class names its own (`name`, `config_class`), and
tests/config/test_config.py checks that they agree with its line here.

Adding an engine: its module under runtime/engine/backends/, one `Engine(...)` line below and,
if it has knobs, their dataclass here. A plugin backend ("module:Class") takes the shared
axes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Literal


@dataclass(frozen=True)
class OnnxRuntimeConfig:
    """ONNX Runtime variant knobs (each list is one axis of the grid)."""

    spinning: tuple[bool, ...] = (False, True)
    graph_optimization: tuple[Literal["basic", "extended", "all"], ...] = ("all",)
    include_default: bool = True  # also profile ORT's default session options, for comparison


@dataclass(frozen=True)
class OpenVinoConfig:
    """OpenVINO variant knobs."""

    performance_hint: tuple[Literal["LATENCY", "THROUGHPUT"], ...] = ("LATENCY",)
    precision_hints: tuple[Literal["f32", "bf16", "f16"], ...] = ("f32", "bf16", "f16")
    cache_dir: str = ""  # compiled-model cache; empty = no cache


@dataclass(frozen=True)
class OpenCvConfig:
    """OpenCV DNN variant knobs."""

    engines: tuple[Literal["new", "classic"], ...] = ("new", "classic")
    fp16_target: bool = True  # also try DNN_TARGET_CPU_FP16 where it exists


@dataclass(frozen=True)
class Engine:
    """One built-in engine, as the config knows it."""

    name: str  # in `enabled`, in variant ids, and its section `[backends.<name>]`
    backend: str  # "module:Class"; imported by runtime.engine.backends.discover, never here
    knobs: type | None = None  # the dataclass of `[backends.<name>]`; None: no section


# The registry: one line per engine, in the default `enabled` order.
REGISTRY: tuple[Engine, ...] = (
    Engine("onnxruntime", "runtime.engine.backends.onnxruntime:OnnxRuntimeBackend",
           OnnxRuntimeConfig),
    Engine("openvino", "runtime.engine.backends.openvino:OpenVinoBackend", OpenVinoConfig),
    Engine("opencv", "runtime.engine.backends.opencv:OpenCvBackend", OpenCvConfig),
    Engine("opencl", "runtime.engine.backends.opencl:OpenClBackend"),
)
ENGINES = tuple(e.name for e in REGISTRY)
BY_NAME = {e.name: e for e in REGISTRY}
EngineName = Literal[ENGINES]  # type: ignore[valid-type]  # `enabled`'s values, from REGISTRY


@dataclass(frozen=True)
class SharedBackendsConfig:
    """Which engines to try and the shared thread axis (every engine's own section is added
    from REGISTRY: `BackendsConfig`)."""

    enabled: tuple[EngineName, ...] = ENGINES
    threads: tuple[int, ...] = ()  # empty: 1 and every core
    plugins: tuple[str, ...] = ()  # extra backends as "module:Class" (vendor SDKs, tests)

    def validate(self) -> tuple[str, str] | None:
        """The first invalid key and why (None: valid)."""
        if any(t < 1 for t in self.threads):
            return "threads", f"every entry must be >= 1, got {list(self.threads)}"
        bad = [p for p in self.plugins if p.count(":") != 1]
        if bad:
            return "plugins", f"each entry must be 'module:Class', got {bad}"
        return None

    def knobs(self, engine: str) -> object | None:
        """`[backends.<engine>]` (None: the engine has no knobs, or is a plugin)."""
        entry = BY_NAME.get(engine)
        return getattr(self, engine) if entry is not None and entry.knobs else None


# `[backends]`: the shared keys and a field `<name>: <knobs>` per engine of REGISTRY with knobs
# (`cfg.backends.openvino.cache_dir`; `BackendsConfig(onnxruntime=OnnxRuntimeConfig(...))`).
BackendsConfig = make_dataclass(
    "BackendsConfig",
    [(e.name, e.knobs, field(default_factory=e.knobs)) for e in REGISTRY if e.knobs],
    bases=(SharedBackendsConfig,), frozen=True,
    namespace={"__doc__": "Which engines to try, the shared thread axis and each engine's "
                          "knobs (`[backends.<engine>]`, one per REGISTRY entry with knobs).",
               "__module__": __name__})
