"""The `[backends]` section: which engines to try, the shared thread axis, and each engine's
own knobs (`[backends.<engine>]`). One config class per engine; the engine's file names it
(`config_class` on its backend class, runtime/engine/backends/*.py). A plugin backend
("module:Class") takes the shared axes only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ENGINES = ("onnxruntime", "openvino", "opencv", "opencl")


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
class BackendsConfig:
    """Which engines to try and the shared thread axis."""

    enabled: tuple[Literal["onnxruntime", "openvino", "opencv", "opencl"], ...] = ENGINES
    threads: tuple[int, ...] = ()  # empty: 1 and every core
    plugins: tuple[str, ...] = ()  # extra backends as "module:Class" (vendor SDKs, tests)
    onnxruntime: OnnxRuntimeConfig = field(default_factory=OnnxRuntimeConfig)
    openvino: OpenVinoConfig = field(default_factory=OpenVinoConfig)
    opencv: OpenCvConfig = field(default_factory=OpenCvConfig)

    def validate(self) -> tuple[str, str] | None:
        if any(t < 1 for t in self.threads):
            return "threads", f"every entry must be >= 1, got {list(self.threads)}"
        bad = [p for p in self.plugins if p.count(":") != 1]
        if bad:
            return "plugins", f"each entry must be 'module:Class', got {bad}"
        return None
