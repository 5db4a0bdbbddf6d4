"""A tiny classifier served by ONNX Runtime, for tests that need a real engine session fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.config import BackendsConfig, OnnxRuntimeConfig
from runtime.engine.backends import discover
from runtime.engine.manifest import load_model, model_files
from runtime.frames.pipeline import Active
from support.modelgen import tiny_cnn

# one CPU thread, no spinning, no default session: the smallest variant set ONNX Runtime offers
BACKENDS = BackendsConfig(enabled=("onnxruntime",), threads=(1,),
                          onnxruntime=OnnxRuntimeConfig(spinning=(False,),
                                                        include_default=False))


def tiny_variant(folder: Path) -> tuple[Any, Any, Any]:
    """(model, backend, variant): a 32x32 tiny_cnn written to `folder`/tiny.onnx, the ONNX
    Runtime backend and its one-thread CPU variant of it (not loaded)."""
    m = load_model(tiny_cnn(folder / "tiny.onnx", hw=(32, 32)))
    (backend,) = discover(BACKENDS)
    return m, backend, backend.variants(model_files(m)[0], BACKENDS, (1,))[0]


def tiny_active(folder: Path) -> tuple[Any, Active]:
    """(model, Active): tiny_variant's variant loaded, as a pipeline's first session."""
    m, backend, v = tiny_variant(folder)
    return m, Active(0, v.id, backend.load(v), v.model.input_shape)


def closed(a: Active) -> bool:
    """Whether `a`'s session was closed: a closed session refuses to infer."""
    try:
        a.session.infer(np.zeros(a.input_shape, np.float32))
    except Exception:
        return True
    return False
