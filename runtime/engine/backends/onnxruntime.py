"""ONNX Runtime backend: every execution provider present; threads, spinning, graph level."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from runtime.config.backends import BackendsConfig, OnnxRuntimeConfig
from runtime.engine.backends.base import BackendError, Device, ModelFile, Variant, summarize_error

# Providers that are not a local device (Azure calls a remote endpoint).
_NOT_DEVICES = {"AzureExecutionProvider"}
_LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


# onnxruntime_session_options_config_keys.h, kOrtSessionOptionsDisableCPUEPFallback: "1"
# makes session creation fail when a node would be assigned to the CPU EP (invalid together
# with an explicit CPU EP, which edgerun never adds to a non-CPU session)
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"


def no_fallback(device: str) -> dict[str, str]:
    """Session config entries for a provider: on any provider but the CPU, no silent
    fallback of nodes to the CPU (`actual_device` names the first provider only,
    so a CUDA session running half its nodes on the CPU reported CUDA)."""
    return {} if device.upper() == "CPU" else {DISABLE_CPU_FALLBACK: "1"}


def _device_id(provider: str) -> str:
    return provider.removesuffix("ExecutionProvider")


class OnnxRuntimeSession:
    """An ORT InferenceSession on one provider."""

    def __init__(self, sess: ort.InferenceSession, input_name: str):
        self._sess, self._input = sess, input_name
        self.actual_device = _device_id(sess.get_providers()[0])

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._sess.run(None, {self._input: batch})[0]

    def close(self) -> None:
        self._sess = None  # type: ignore[assignment]


class OnnxRuntimeBackend:
    """ONNX Runtime."""

    name = "onnxruntime"
    config_class = OnnxRuntimeConfig  # its knobs: [backends.onnxruntime]

    def __init__(self, knobs: OnnxRuntimeConfig | None = None) -> None:
        """Built by `discover` with its knobs; they are all per variant (variants() reads
        them from the config it is handed), so none is kept here."""

    def devices(self) -> list[Device]:
        return [
            Device(self.name, _device_id(p), p, {"version": ort.__version__})
            for p in ort.get_available_providers()
            if p not in _NOT_DEVICES
        ]

    def variants(self, model: ModelFile, cfg: BackendsConfig,
                 threads: tuple[int, ...]) -> list[Variant]:
        knobs = cfg.onnxruntime
        out = []
        for dev in self.devices():
            if knobs.include_default:  # what a user gets with InferenceSession(path)
                out.append(Variant(model, model.precision, self.name, dev.id, 0))
            for t in threads:
                for spin in knobs.spinning if t > 1 else (False,):
                    for level in knobs.graph_optimization:
                        opts = (("opt", level),) + ((("spin", "on" if spin else "off"),)
                                                    if t > 1 else ())
                        out.append(Variant(model, model.precision, self.name, dev.id, t, opts))
        return out

    def load(self, variant: Variant) -> OnnxRuntimeSession:
        so = ort.SessionOptions()
        so.log_severity_level = 3  # errors only: warnings go to our log via exceptions
        if variant.threads:
            so.intra_op_num_threads = variant.threads
            so.inter_op_num_threads = 1
            so.add_session_config_entry(
                "session.intra_op.allow_spinning", "1" if variant.option("spin") == "on" else "0"
            )
        if variant.option("opt"):
            so.graph_optimization_level = _LEVELS[variant.option("opt")]
        provider = variant.device + "ExecutionProvider"
        for k, v in no_fallback(variant.device).items():
            so.add_session_config_entry(k, v)
        try:
            sess = ort.InferenceSession(str(variant.model.path), so, providers=[provider])
        except Exception as e:  # ORT raises several private exception types
            why = summarize_error(e)
            if no_fallback(variant.device):
                why = (f"{variant.device} cannot take the whole graph and CPU fallback is "
                       f"disabled (a GPU variant running nodes on the CPU would be billed and "
                       f"reported as the GPU): {why}")
            raise BackendError(self.name, variant.model.path, why) from e
        session = OnnxRuntimeSession(sess, variant.model.input_name)
        if session.actual_device != variant.device:
            raise BackendError(self.name, variant.model.path,
                               f"asked for {variant.device}, ORT placed it on "
                               f"{session.actual_device}")
        return session
