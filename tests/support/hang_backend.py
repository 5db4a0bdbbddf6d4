"""A backend plugin for the watchdog test: ONNX Runtime that blocks forever inside `infer`
once the file named by $EDGERUN_TEST_HANG exists (a hung driver, as seen from the daemon)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from runtime.engine.backends.onnxruntime import OnnxRuntimeBackend


class HangSession:
    def __init__(self, inner):
        self._inner = inner
        self.actual_device = inner.actual_device
        self._flag = Path(os.environ["EDGERUN_TEST_HANG"])

    def infer(self, batch):
        if self._flag.exists():
            threading.Event().wait()  # never returns
        return self._inner.infer(batch)

    def close(self):
        self._inner.close()


class HangBackend(OnnxRuntimeBackend):
    name = "hang"

    def load(self, variant):
        return HangSession(super().load(variant))
