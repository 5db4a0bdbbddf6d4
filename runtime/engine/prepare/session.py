"""A CPU ONNX Runtime session over a graph file: how every step loads, checks and runs the
graphs it makes.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort


def cpu_session(path: Path, quiet: bool = False) -> ort.InferenceSession:
    """The graph at `path` on ORT's CPU provider (`quiet`: not even its errors logged, when
    the caller reports the failure itself)."""
    so = ort.SessionOptions()
    so.log_severity_level = 4 if quiet else 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
