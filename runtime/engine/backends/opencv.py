"""OpenCV DNN backend: the new and classic engines on CPU; OpenCL targets on non-CPU devices.

OpenCV ignores CPU OpenCL devices and falls back to the CPU silently (shared REFERENCE.md),
so an OpenCL target is offered only for a GPU-type OpenCL device, and the fp16 CPU
target only on ARMv8, the one CPU it runs on (elsewhere it falls back to fp32).
"""

from __future__ import annotations

import logging
import platform

import cv2
import numpy as np

from runtime.config.backends import BackendsConfig, OpenCvConfig
from runtime.engine.backends import opencl_loader
from runtime.engine.backends.base import BackendError, Device, ModelFile, Variant, summarize_error
from runtime.engine.onnx_model import ModelError, load_onnx, model_input, with_fixed_input

# Errors reach the operator through BackendError; OpenCV's own console output would
# only duplicate them without the model's name.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
log = logging.getLogger(__name__)
# before anything here asks OpenCV about OpenCL: OpenCV's first question loads the OpenCL
# library it then keeps, and with it every later pyopencl call (opencl_loader.py)
log.debug("opencv: %s", opencl_loader.share())


def engines_of(dnn: object) -> dict[str, int | None]:
    """The DNN engines this OpenCV has, by edgerun's names (None: the only engine, loaded
    without choosing). 5.0 has both (ENGINE_NEW, ENGINE_CLASSIC); 4.x has the classic engine
    alone and no switch; 5.1 calls the new engine ENGINE_OPENCV and has dropped the classic
    one with its non-CPU and fp16 targets."""
    if hasattr(dnn, "ENGINE_CLASSIC"):
        return {"new": dnn.ENGINE_NEW, "classic": dnn.ENGINE_CLASSIC}
    if hasattr(dnn, "ENGINE_OPENCV"):
        return {"new": dnn.ENGINE_OPENCV}
    return {"classic": None}


_ENGINES = engines_of(cv2.dnn)


class OpenCvSession:
    """A cv2.dnn.Net. OpenCV's thread count is process-wide, so it is set per call."""

    def __init__(self, net: cv2.dnn.Net, threads: int, device: str):
        self._net, self._threads = net, threads
        self.actual_device = device

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self._threads and cv2.getNumThreads() != self._threads:
            cv2.setNumThreads(self._threads)
        self._net.setInput(batch)
        return self._net.forward()

    def close(self) -> None:
        self._net = None  # type: ignore[assignment]


def _gpu_opencl() -> str | None:
    if not cv2.ocl.haveOpenCL():
        return None
    dev = cv2.ocl.Device.getDefault()
    if dev.available() and dev.type() != cv2.ocl.Device_TYPE_CPU:
        return dev.name()
    return None


class OpenCvBackend:
    """OpenCV's DNN module."""

    name = "opencv"
    config_class = OpenCvConfig  # its knobs: [backends.opencv]

    def __init__(self, knobs: OpenCvConfig | None = None) -> None:
        """Built by `discover` with its knobs; they are all per variant (variants() reads
        them from the config it is handed), so none is kept here."""
        self._missing_said: set[str] = set()

    def _say_missing(self, engine: str) -> None:
        if engine not in self._missing_said:
            self._missing_said.add(engine)
            log.info("opencv: OpenCV %s has no %s DNN engine; its variants are not offered",
                     cv2.__version__, engine)

    def devices(self) -> list[Device]:
        out = [Device(self.name, "CPU", platform.processor() or platform.machine(),
                      {"version": cv2.__version__})]
        gpu = _gpu_opencl() if "classic" in _ENGINES else None
        if gpu:
            out.append(Device(self.name, "OpenCL", gpu, {"version": cv2.__version__}))
        return out

    def variants(self, model: ModelFile, cfg: BackendsConfig,
                 threads: tuple[int, ...]) -> list[Variant]:
        knobs = cfg.opencv
        arm = platform.machine().lower() in ("aarch64", "arm64")
        out = []
        for dev in self.devices():
            if dev.id == "OpenCL":  # only the classic engine has non-CPU targets
                out.append(Variant(model, model.precision, self.name, "OpenCL", 0,
                                   (("engine", "classic"),)))
                continue
            for engine in knobs.engines:
                if engine not in _ENGINES:
                    self._say_missing(engine)
                    continue
                for t in threads:
                    out.append(Variant(model, model.precision, self.name, "CPU", t,
                                       (("engine", engine),)))
                    if arm and engine == "classic" and knobs.fp16_target \
                            and model.precision == "fp32":
                        out.append(Variant(model, "fp16", self.name, "CPU", t,
                                           (("engine", engine), ("target", "cpu_fp16"))))
        return out

    def load(self, variant: Variant) -> OpenCvSession:
        m = variant.model
        try:
            proto = load_onnx(m.path)
            inp = model_input(proto, m.path, m.input_shape)
            buf = np.frombuffer(with_fixed_input(proto, inp), dtype=np.uint8)
            name = variant.option("engine", "new")
            if name not in _ENGINES:  # a variant named from elsewhere (a cache, a command)
                raise BackendError(self.name, m.path, f"OpenCV {cv2.__version__} has no "
                                   f"{name} DNN engine")
            engine = _ENGINES[name]
            net = cv2.dnn.readNetFromONNX(buf) if engine is None \
                else cv2.dnn.readNetFromONNX(buf, engine)
            if net.empty():
                raise BackendError(self.name, m.path, f"OpenCV's {variant.option('engine')} "
                                   "engine could not build the graph (an op it does not support)")
            if variant.device == "OpenCL":
                net.setPreferableTarget(cv2.dnn.DNN_TARGET_OPENCL)
            elif variant.option("target") == "cpu_fp16":
                net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU_FP16)
            session = OpenCvSession(net, variant.threads, variant.device)
            # OpenCV builds its layers lazily: run once so unsupported ops fail here.
            session.infer(np.zeros(m.input_shape, dtype=np.float32))
        except (cv2.error, ModelError) as e:
            raise BackendError(self.name, m.path, summarize_error(e)) from e
        return session
