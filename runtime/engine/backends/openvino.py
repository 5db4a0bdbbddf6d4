"""OpenVINO backend: every device Core() reports; threads, performance and precision hints."""

from __future__ import annotations

import numpy as np
import openvino as ov

from runtime.config.backends import BackendsConfig, OpenVinoConfig
from runtime.engine.backends.base import BackendError, Device, ModelFile, Variant, summarize_error

# inference precision hint -> (capability the device must report, variant precision name)
_HINTS = {"f32": ("FP32", "fp32"), "bf16": ("BF16", "bf16"), "f16": ("FP16", "fp16")}


class OpenVinoSession:
    """A compiled model and one infer request."""

    def __init__(self, compiled: ov.CompiledModel):
        self._compiled = compiled
        self._req = compiled.create_infer_request()
        self.actual_device = ",".join(compiled.get_property("EXECUTION_DEVICES"))

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self._req.infer({0: batch})
        return self._req.get_output_tensor(0).data.copy()

    def close(self) -> None:
        self._req = None  # type: ignore[assignment]
        self._compiled = None  # type: ignore[assignment]


class OpenVinoBackend:
    """Intel OpenVINO."""

    name = "openvino"
    config_class = OpenVinoConfig  # its knobs: [backends.openvino]

    def __init__(self, knobs: OpenVinoConfig | None = None):
        self._core = ov.Core()
        cache_dir = (knobs or OpenVinoConfig()).cache_dir
        if cache_dir:
            self._core.set_property({"CACHE_DIR": cache_dir})

    def devices(self) -> list[Device]:
        out = []
        for dev in self._core.available_devices:
            try:
                caps = self._core.get_property(dev, "OPTIMIZATION_CAPABILITIES")
                full = self._core.get_property(dev, "FULL_DEVICE_NAME")
            except RuntimeError:  # a listed device whose plugin will not answer is unusable
                continue
            out.append(Device(self.name, dev, str(full),
                              {"capabilities": " ".join(caps), "version": ov.__version__}))
        return out

    def variants(self, model: ModelFile, cfg: BackendsConfig,
                 threads: tuple[int, ...]) -> list[Variant]:
        knobs = cfg.openvino
        out = []
        for dev in self.devices():
            caps = dev.details["capabilities"].split()
            # A lower precision hint only changes a full-precision model.
            hints = knobs.precision_hints if model.precision == "fp32" else ("f32",)
            # Thread counts mean something on CPU only; other devices run their own way.
            dev_threads = threads if dev.id.startswith("CPU") else (0,)
            for hint in hints:
                cap, precision = _HINTS[hint]
                if cap not in caps:
                    continue
                for t in dev_threads:
                    for perf in knobs.performance_hint:
                        opts = (("hint", perf.lower()),)
                        if precision != model.precision:
                            opts += (("precision", hint),)
                        out.append(Variant(model, precision if model.precision == "fp32"
                                           else model.precision, self.name, dev.id, t, opts))
        return out

    def load(self, variant: Variant) -> OpenVinoSession:
        m = variant.model
        config: dict[str, object] = {
            "PERFORMANCE_HINT": variant.option("hint", "latency").upper(),
        }
        if variant.threads:
            config["INFERENCE_NUM_THREADS"] = variant.threads
        if variant.option("precision"):
            config["INFERENCE_PRECISION_HINT"] = variant.option("precision")
        elif variant.device.startswith("CPU"):
            # The CPU plugin defaults to bf16 where the CPU has it: pin f32 so the
            # variant is what its id says.
            config["INFERENCE_PRECISION_HINT"] = "f32"
        try:
            model = self._core.read_model(str(m.path))
            if model.inputs[0].get_partial_shape().is_dynamic:
                model.reshape({m.input_name: ov.PartialShape(list(m.input_shape))})
            compiled = self._core.compile_model(model, variant.device, config)
        except Exception as e:  # OpenVINO raises RuntimeError and its own types
            raise BackendError(self.name, m.path, summarize_error(e)) from e
        return OpenVinoSession(compiled)
