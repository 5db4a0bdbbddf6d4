"""Every backend loads and runs a small ONNX model and agrees with ORT fp32 (OpenCL: on each
device that works, tests/support/opencl_devices.py)."""

from __future__ import annotations

import numpy as np
import pytest
from support import opencl_devices
from support.modelgen import tiny_cnn

from runtime.config import BackendsConfig
from runtime.engine.backends import BackendError, DeviceRefused, ModelFile, discover
from runtime.engine.backends.onnxruntime import OnnxRuntimeBackend
from runtime.engine.onnx_model import ModelError, load_onnx, model_input

BACKENDS = discover(BackendsConfig())
NAMES = [b.name for b in BACKENDS]
# Tolerance by effective precision: bf16 keeps 8 bits of mantissa.
TOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}


def model_file(path, shape=(1, 3, 32, 32)) -> ModelFile:
    return ModelFile("tiny", "fp32", path, "x", shape)


def first_that_runs(variants):
    """The first variant on a device that works here (tests/support/opencl_devices.py)."""
    v = next((v for v in variants if opencl_devices.runs(v)), None)
    if v is None:
        pytest.skip(f"no OpenCL device works here: {opencl_devices.broken()}")
    return v


def reference(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def test_all_engines_installed_here_are_found():
    assert {"onnxruntime", "openvino", "opencv", "opencl"} <= set(NAMES)


@pytest.mark.parametrize("backend", BACKENDS, ids=NAMES)
def test_every_variant_agrees_with_ort(backend, tiny_model):
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = reference(tiny_model, x)
    variants = backend.variants(model_file(tiny_model), BackendsConfig(), (1, 2))
    assert variants
    for v in variants:
        if v.engine == "opencl" and v.device in opencl_devices.broken():
            # a device whose driver cannot build kernels refuses, naming itself and why
            with pytest.raises(DeviceRefused, match=f"device {v.device} .* cannot build the "):
                backend.load(v)
            continue
        if not opencl_devices.runs(v):  # EDGERUN_TEST_OPENCL_DEVICE names another device
            continue
        s = backend.load(v)
        try:
            got = s.infer(x)
            assert s.actual_device.startswith(v.device), v.id
            tol = TOL["fp16"] if v.option("storage") == "fp16" else TOL[v.precision]
            np.testing.assert_allclose(got.reshape(want.shape), want, atol=tol, err_msg=v.id)
        finally:
            s.close()


@pytest.mark.parametrize("backend", BACKENDS, ids=NAMES)
def test_dynamic_hw_model_runs_with_fixed_shape(backend, tmp_path):
    path = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    inp = model_input(load_onnx(path), path, (1, 3, 40, 24))
    v = first_that_runs(backend.variants(ModelFile("dyn", "fp32", path, inp.name, inp.shape),
                                         BackendsConfig(), (1,)))
    x = np.ones(inp.shape, np.float32)
    np.testing.assert_allclose(backend.load(v).infer(x).reshape(1, 5), reference(path, x),
                               atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS, ids=NAMES)
def test_truncated_model_is_a_clear_error(backend, tiny_model, tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(tiny_model.read_bytes()[:300])
    v = first_that_runs(backend.variants(model_file(bad), BackendsConfig(), (1,)))
    with pytest.raises(BackendError) as e:
        backend.load(v)
    assert str(bad) in str(e.value) and backend.name in str(e.value)


def test_unsupported_op_fails_only_where_unsupported(tmp_path):
    # RandomUniformLike: ORT and OpenVINO have it, OpenCV's DNN does not.
    path = tiny_cnn(tmp_path / "odd.onnx", extra_op="RandomUniformLike")
    results = {}
    for b in BACKENDS:
        for v in filter(opencl_devices.runs, b.variants(model_file(path), BackendsConfig(), (1,))):
            try:
                b.load(v).infer(np.ones((1, 3, 32, 32), np.float32))
                results[v.id] = "ok"
            except BackendError as e:
                results[v.id] = str(e)
    cv = [r for k, r in results.items() if "@opencv" in k]
    assert cv and all("RandomUniformLike" in r or "could not build" in r for r in cv)
    assert any("odd.onnx" in r for r in cv)
    assert all(r == "ok" for k, r in results.items() if "@opencv" not in k)


def test_model_input_errors(tmp_path, tiny_model):
    dyn = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    with pytest.raises(ModelError, match="dynamic dimensions.*input_shape"):
        model_input(load_onnx(dyn), dyn)
    with pytest.raises(ModelError, match="rank 4"):
        model_input(load_onnx(dyn), dyn, (1, 3, 32))
    with pytest.raises(ModelError, match="contradicts"):
        model_input(load_onnx(tiny_model), tiny_model, (1, 3, 64, 64))
    assert model_input(load_onnx(tiny_model), tiny_model).shape == (1, 3, 32, 32)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelError, match="bad.onnx"):
        load_onnx(bad)


def test_initializers_listed_as_inputs_are_skipped(tmp_path):
    import onnx

    path = tiny_cnn(tmp_path / "old.onnx")
    m = onnx.load(str(path))
    for init in m.graph.initializer:  # what old exporters did
        m.graph.input.append(onnx.helper.make_tensor_value_info(
            init.name, init.data_type, list(init.dims)))
    onnx.save(m, str(path))
    assert model_input(load_onnx(path), path).name == "x"


def test_ort_reports_device_and_rejects_missing_provider(tiny_model):
    b = OnnxRuntimeBackend()
    assert {d.id for d in b.devices()} >= {"CPU"}
    assert "Azure" not in {d.id for d in b.devices()}
    v = b.variants(model_file(tiny_model), BackendsConfig(), (1,))[0]
    from dataclasses import replace

    with pytest.raises(BackendError):
        b.load(replace(v, device="NoSuchDevice"))


@pytest.mark.parametrize("names, want", [
    # OpenCV 5.0: both engines
    ({"ENGINE_NEW": 3, "ENGINE_CLASSIC": 1, "ENGINE_AUTO": 0}, {"new": 3, "classic": 1}),
    # 5.1: the new engine is ENGINE_OPENCV; classic (and its targets) gone
    ({"ENGINE_OPENCV": 2, "ENGINE_ORT": 4, "ENGINE_AUTO": 0}, {"new": 2}),
    # 4.x: the classic engine alone, no switch
    ({"DNN_BACKEND_INFERENCE_ENGINE": 2}, {"classic": None}),
])
def test_opencv_engines_are_found_by_what_the_installed_opencv_names(names, want):
    from types import SimpleNamespace

    from runtime.engine.backends.opencv import engines_of

    assert engines_of(SimpleNamespace(**names)) == want


def test_an_opencv_variant_for_an_engine_this_opencv_lacks_is_a_clear_error(tiny_model):
    """A variant named elsewhere (an older cache, another OpenCV) for an engine the installed
    OpenCV has not: a BackendError naming the engine, not a KeyError from the load."""
    from runtime.engine.backends import Variant
    from runtime.engine.backends.opencv import OpenCvBackend

    v = Variant(model_file(tiny_model), "fp32", "opencv", "CPU", 1, (("engine", "nosuch"),))
    with pytest.raises(BackendError, match="no nosuch DNN engine"):
        OpenCvBackend().load(v)


@pytest.mark.parametrize("device, entries", [
    ("CPU", {}), ("cpu", {}),
    ("CUDA", {"session.disable_cpu_ep_fallback": "1"}),
    ("TensorRT", {"session.disable_cpu_ep_fallback": "1"}),
    ("OpenVINO", {"session.disable_cpu_ep_fallback": "1"}),
])
def test_ort_sessions_off_the_cpu_never_fall_back_to_it(device, entries):
    from runtime.engine.backends.onnxruntime import no_fallback

    assert no_fallback(device) == entries


def test_an_ort_provider_that_cannot_take_the_graph_is_refused_with_the_reason(tiny_model):
    b = OnnxRuntimeBackend()
    v = b.variants(model_file(tiny_model), BackendsConfig(), (1,))[0]
    from dataclasses import replace

    # a provider this ORT lacks: with fallback disabled, no CPU session stands in for it
    with pytest.raises(BackendError, match="NoSuchDevice"):
        b.load(replace(v, device="NoSuchDevice"))


def test_discover_hands_each_backend_its_own_section(tmp_path):
    """A built-in backend is built with its `[backends.<name>]` (no special case per engine):
    OpenVINO's compiled-model cache is set from `[backends.openvino] cache_dir`."""
    pytest.importorskip("openvino")
    from runtime.config.backends import OpenVinoConfig

    cfg = BackendsConfig(enabled=("openvino",), openvino=OpenVinoConfig(cache_dir=str(tmp_path)))
    (ov,) = discover(cfg)
    assert ov._core.get_property("CACHE_DIR") == str(tmp_path)
    (plain,) = discover(BackendsConfig(enabled=("openvino",)))
    assert plain._core.get_property("CACHE_DIR") == ""
