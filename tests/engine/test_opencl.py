"""The OpenCL backend on each OpenCL device that works (tests/support/opencl_devices.py): every
op against ONNX Runtime, whole models, preprocessing, and a device that refuses the kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save
from support import opencl_devices

from runtime.engine.backends.base import BackendError, ModelFile, Variant
from runtime.engine.manifest import Preprocess

cl = pytest.importorskip("pyopencl")
from runtime.engine.backends.opencl import OpenClBackend, OpenClPreprocessor  # noqa: E402


@pytest.fixture(scope="module", params=opencl_devices.params())
def device(request) -> str:
    """Each OpenCL device that works, by id (or the one EDGERUN_TEST_OPENCL_DEVICE names)."""
    return opencl_devices.require(request.param)


@pytest.fixture(scope="module")
def backend():
    return OpenClBackend()


def _model(tmp_path, nodes, inputs, output_shape, inits=(), name="m"):
    """A graph with float inputs {name: shape} and one output 'y'."""
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape))
    g = helper.make_graph(nodes, name, ins, [out], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    save(m, str(path))
    return path


def _run_both(backend, device, path, shape, storage="fp32", seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    mf = ModelFile("t", "fp32", path, "x", tuple(shape))
    s = backend.load(Variant(mf, "fp32", "opencl", device, 0, (("storage", storage),)))
    try:
        got = s.infer(x)
    finally:
        s.close()
    return got, ref


def _w(rng, name, shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


CONV_CASES = [
    # (C, OC, H, W, k, attrs)
    (3, 5, 11, 13, 3, {"pads": [1, 1, 1, 1]}),
    (4, 6, 9, 10, 3, {"strides": [2, 2], "pads": [0, 1, 2, 1]}),
    (6, 4, 12, 11, 3, {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    (5, 5, 10, 9, 3, {"group": 5, "strides": [2, 1], "pads": [1, 1, 1, 1]}),  # depthwise
    (7, 9, 6, 5, 1, {}),  # pointwise -> tiled 1x1 kernel
    (3, 4, 8, 8, 5, {"strides": [3, 3], "auto_pad": "SAME_UPPER"}),
    (4, 8, 7, 9, 2, {"strides": [1, 2]}),
]


@pytest.mark.parametrize("C, OC, H, W, k, attrs", CONV_CASES)
@pytest.mark.parametrize("act", [None, "Relu"])
def test_conv_matches_ort(backend, device, tmp_path, C, OC, H, W, k, attrs, act):
    rng = np.random.default_rng(1)
    g = attrs.get("group", 1)
    inits = [_w(rng, "w", (OC, C // g, k, k)), _w(rng, "b", (OC,))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"],
                              kernel_shape=[k, k], **attrs)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    path = _model(tmp_path, nodes, {"x": (1, C, H, W)}, ["N", OC, "H", "W"], inits)
    got, ref = _run_both(backend, device, path, (1, C, H, W))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


ACTS = [("Relu", {}), ("LeakyRelu", {"alpha": 0.07}), ("Sigmoid", {}),
        ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}), ("HardSwish", {}), ("Clip", "inputs")]


@pytest.mark.parametrize("op, attrs", ACTS)
@pytest.mark.parametrize("after_conv", [False, True])
def test_activations(backend, device, tmp_path, op, attrs, after_conv):
    rng = np.random.default_rng(2)
    inits, nodes, src = [], [], "x"
    if after_conv:
        inits += [_w(rng, "w", (4, 3, 3, 3)), _w(rng, "b", (4,))]
        nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]))
        src = "c"
    if attrs == "inputs":
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(0.8, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [src, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(op, [src], ["y"], **attrs))
    C = 4 if after_conv else 3
    path = _model(tmp_path, nodes, {"x": (1, 3, 7, 9)}, [1, C, 7, 9], inits)
    got, ref = _run_both(backend, device, path, (1, 3, 7, 9))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1],
                     "count_include_pad": 1}),
    ("GlobalAveragePool", {}),
])
def test_pools(backend, device, tmp_path, op, attrs):
    path = _model(tmp_path, [helper.make_node(op, ["x"], ["y"], **attrs)],
                  {"x": (2, 3, 11, 9)}, ["N", 3, "H", "W"])
    got, ref = _run_both(backend, device, path, (2, 3, 11, 9))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("other", [(1, 4, 5, 6), (1, 4, 1, 1), (1,), (6,)])
def test_binary_broadcast(backend, device, tmp_path, op, other):
    rng = np.random.default_rng(3)
    inits = [_w(rng, "z", other, 1.0)]
    path = _model(tmp_path, [helper.make_node(op, ["x", "z"], ["y"])], {"x": (1, 4, 5, 6)},
                  [1, 4, 5, 6], inits)
    got, ref = _run_both(backend, device, path, (1, 4, 5, 6))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_batchnorm_standalone_concat_reshape_matmul_softmax(backend, device, tmp_path):
    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 3).astype(np.float32), "s"),
        _w(rng, "bb", (3,)), _w(rng, "m", (3,), 0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 3).astype(np.float32), "v"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
        _w(rng, "mm", (3 * 5 * 4 * 2, 7)),
    ]
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["bn"]),
        helper.make_node("Concat", ["bn", "x"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "mm"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    path = _model(tmp_path, nodes, {"x": (1, 3, 5, 4)}, [1, 7], inits)
    got, ref = _run_both(backend, device, path, (1, 3, 5, 4))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-4)


def test_gemm_variants(backend, device, tmp_path):
    rng = np.random.default_rng(5)
    inits = [_w(rng, "b1", (6, 10)), _w(rng, "c1", (6,)), _w(rng, "b2", (6, 3)),
             _w(rng, "c2", (1, 3))]
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"]),
        helper.make_node("Gemm", ["f", "b1", "c1"], ["g1"], transB=1, alpha=0.7, beta=1.3),
        helper.make_node("Gemm", ["g1", "b2", "c2"], ["y"]),
    ]
    path = _model(tmp_path, nodes, {"x": (1, 10, 1, 1)}, [1, 3], inits)
    got, ref = _run_both(backend, device, path, (1, 10, 1, 1))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-4)


def mobilenet_style(tmp_path, seed=0):
    """Stem conv+BN+HardSwish, depthwise-separable blocks with BN, a residual Add, a
    squeeze-excite style Mul with HardSigmoid, pooling, Gemm, Softmax."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def bn(name, c):
        inits.extend([numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32),
                                              f"{name}_s"),
                      _w(rng, f"{name}_b", (c,)), _w(rng, f"{name}_m", (c,), 0.1),
                      numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32),
                                              f"{name}_v")])
        return [f"{name}_s", f"{name}_b", f"{name}_m", f"{name}_v"]

    inits.append(_w(rng, "w0", (8, 3, 3, 3)))
    nodes += [helper.make_node("Conv", ["x", "w0"], ["c0"], strides=[2, 2], pads=[1, 1, 1, 1]),
              helper.make_node("BatchNormalization", ["c0", *bn("bn0", 8)], ["b0"]),
              helper.make_node("HardSwish", ["b0"], ["a0"])]
    inits += [_w(rng, "dw1", (8, 1, 3, 3)), _w(rng, "pw1", (8, 8, 1, 1))]
    nodes += [helper.make_node("Conv", ["a0", "dw1"], ["d1"], group=8, pads=[1, 1, 1, 1]),
              helper.make_node("BatchNormalization", ["d1", *bn("bn1", 8)], ["e1"]),
              helper.make_node("Relu", ["e1"], ["r1"]),
              helper.make_node("Conv", ["r1", "pw1"], ["p1"]),
              helper.make_node("BatchNormalization", ["p1", *bn("bn2", 8)], ["q1"]),
              helper.make_node("Add", ["q1", "a0"], ["res"])]
    inits += [_w(rng, "se_w", (8, 8, 1, 1)), _w(rng, "se_b", (8,))]
    nodes += [helper.make_node("GlobalAveragePool", ["res"], ["sq"]),
              helper.make_node("Conv", ["sq", "se_w", "se_b"], ["ex"]),
              helper.make_node("HardSigmoid", ["ex"], ["gate"]),
              helper.make_node("Mul", ["res", "gate"], ["se"])]
    inits += [_w(rng, "dw2", (8, 1, 3, 3)), _w(rng, "pw2", (16, 8, 1, 1))]
    nodes += [helper.make_node("Conv", ["se", "dw2"], ["d2"], group=8, strides=[2, 2],
                               pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["d2"], ["r2"]),
              helper.make_node("Conv", ["r2", "pw2"], ["p2"]),
              helper.make_node("BatchNormalization", ["p2", *bn("bn3", 16)], ["q2"]),
              helper.make_node("HardSwish", ["q2"], ["a2"]),
              helper.make_node("MaxPool", ["a2"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"])]
    inits += [_w(rng, "fc", (5, 16)), _w(rng, "fcb", (5,))]
    nodes += [helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    return _model(tmp_path, nodes, {"x": (1, 3, 33, 29)}, [1, 5], inits, name="mnet")


@pytest.mark.parametrize("storage, tol", [("fp32", 1e-4), ("fp16", 3e-3)])
def test_mobilenet_style_model(backend, device, tmp_path, storage, tol):
    got, ref = _run_both(backend, device, mobilenet_style(tmp_path), (1, 3, 33, 29), storage)
    np.testing.assert_allclose(got, ref, atol=tol)


@pytest.mark.parametrize("storage, tol", [("fp32", 1e-4), ("fp16", 3e-3)])
def test_bundled_model_variants(backend, device, storage, tol):
    from models import bundled
    from runtime.engine.manifest import load_manifest

    man = load_manifest(bundled())
    forms = [v for v in man.variants if v.precision in ("fp32", "fp32-reduced")]
    assert forms
    for v in forms:
        x = np.random.default_rng(7).standard_normal(v.input_shape).astype(np.float32)
        ref = ort.InferenceSession(str(man.path(v)), providers=["CPUExecutionProvider"]).run(
            None, {v.input_name: x})[0]
        mf = ModelFile("inspection", v.name, man.path(v), v.input_name, v.input_shape)
        s = backend.load(Variant(mf, v.name, "opencl", device, 0, (("storage", storage),)))
        got = s.infer(x)
        s.close()
        np.testing.assert_allclose(got, ref, atol=tol, err_msg=v.name)


def test_unsupported_graph_is_refused_with_the_op_list(backend, device, tmp_path):
    nodes = [helper.make_node("Hardmax", ["x"], ["h"]), helper.make_node("Erf", ["h"], ["y"])]
    path = _model(tmp_path, nodes, {"x": (1, 4)}, [1, 4])
    mf = ModelFile("t", "fp32", path, "x", (1, 4))
    from runtime.config import BackendsConfig

    assert backend.variants(mf, BackendsConfig(), (1,)) == []  # never offered
    with pytest.raises(BackendError, match="unsupported ops: Erf, Hardmax"):
        backend.load(Variant(mf, "fp32", "opencl", device, 0, (("storage", "fp32"),)))


def test_devices_report_limits(backend, device):
    d = next(x for x in backend.devices() if x.id == device)
    for key in ("platform", "compute_units", "global_mem_mb", "max_work_group", "fp16"):
        assert d.details[key]


def test_no_platform_disables_backend_with_one_line(tmp_path):
    code = ("import logging; logging.basicConfig(level=logging.INFO)\n"
            "from runtime.config import BackendsConfig\n"
            "from runtime.engine.backends import discover\n"
            "print([b.name for b in discover(BackendsConfig(enabled=('opencl',)))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OCL_ICD_VENDORS": str(tmp_path / "none")})
    assert out.stdout.strip() == "[]"
    lines = [x for x in out.stderr.splitlines() if "opencl" in x]
    assert len(lines) == 1 and "disabled" in lines[0]


def _bilinear_ref(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Float bilinear with half-pixel centres and edge clamping (cv2.INTER_LINEAR's rule)."""
    h, w = img.shape[:2]

    def axis(o, n):
        src = (np.arange(o) + 0.5) * n / o - 0.5
        i0 = np.floor(src).astype(int)
        a = src - i0
        a[i0 < 0], i0[i0 < 0] = 0.0, 0
        a[i0 >= n - 1], i0[i0 >= n - 1] = 0.0, n - 1
        return i0, np.minimum(i0 + 1, n - 1), a

    y0, y1, ay = axis(oh, h)
    x0, x1, ax = axis(ow, w)
    f = img.astype(np.float64)
    top = f[y0][:, x0] * (1 - ax)[None, :, None] + f[y0][:, x1] * ax[None, :, None]
    bot = f[y1][:, x0] * (1 - ax)[None, :, None] + f[y1][:, x1] * ax[None, :, None]
    return top * (1 - ay)[:, None, None] + bot * ay[:, None, None]


@pytest.mark.parametrize("resize", ["bilinear", "nearest"])
@pytest.mark.parametrize("src_hw, colour", [((120, 90), "RGB"), ((64, 64), "BGR"),
                                             ((37, 151), "RGB")])
def test_preprocessing_kernel_matches_reference(backend, device, resize, src_hw, colour):
    rng = np.random.default_rng(8)
    frame = rng.integers(0, 256, (*src_hw, 3), dtype=np.uint8)
    pre = Preprocess(colour=colour, resize=resize, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    shape = (1, 3, 48, 64)
    got = OpenClPreprocessor(backend, device, pre, shape)(frame)
    cv_ref = pre.apply(frame, shape)  # what the CPU path feeds the model (cv2, uint8 resize)
    step = 1 / 255 / min(pre.std)  # one 8-bit step after normalisation
    # cv2 rounds the resized image to uint8 (fixed-point weights): within one step of it ...
    assert np.abs(got - cv_ref).max() <= step + 1e-5
    if resize == "bilinear":
        # ... and within float rounding of the exact float bilinear.
        exact = _bilinear_ref(frame, 48, 64)
        if colour == "RGB":
            exact = exact[..., ::-1]
        exact = ((exact / 255 - np.array(pre.mean)) / np.array(pre.std)).transpose(2, 0, 1)
        np.testing.assert_allclose(got[0], exact, atol=1e-4)
    else:
        assert np.abs(got - cv_ref).max() < 1e-5  # nearest picks the same pixels as cv2


def test_preprocessing_fp16_output(backend, device):
    frame = np.random.default_rng(9).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    pre = Preprocess()
    got = OpenClPreprocessor(backend, device, pre, (1, 3, 32, 32), half=True)(frame)
    np.testing.assert_allclose(got, pre.apply(frame, (1, 3, 32, 32)), atol=2e-2)


def test_preprocess_chooser_measures_both_paths_and_caches(backend, device):
    from power.sensors import EstimatedMeter
    from runtime.engine.preprocessing import PreprocessChooser

    pre = Preprocess()
    meter = EstimatedMeter(idle_w=5.0, active_w_per_core=6.0)
    chooser = PreprocessChooser(pre, meter, 5.0,
                                lambda shape: OpenClPreprocessor(backend, device, pre, shape),
                                f"opencl:{device}")
    frame = np.random.default_rng(10).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    shape = (1, 3, 48, 64)
    got = chooser(frame, shape)
    assert np.abs(got - pre.apply(frame, shape)).max() <= 1 / 255 / min(pre.std) + 1e-5
    (label, rows), = chooser.report.items()
    assert label == "160x120->64x48"
    assert {r["path"] for r in rows} == {"cpu", f"opencl:{device}"}
    assert sum(r["chosen"] for r in rows) == 1
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["mj"] == min(r["mj"] for r in rows)
    chooser(frame, shape)
    assert len(chooser.report) == 1  # measured once per (frame size, input shape)


def test_preprocess_chooser_falls_back_to_cpu():
    from power.sensors import EstimatedMeter
    from runtime.engine.preprocessing import PreprocessChooser

    def broken(shape):
        raise RuntimeError("no OpenCL device")

    pre = Preprocess()
    chooser = PreprocessChooser(pre, EstimatedMeter(5.0, 6.0), 5.0, broken)
    frame = np.zeros((20, 30, 3), np.uint8)
    np.testing.assert_array_equal(chooser(frame, (1, 3, 8, 8)), pre.apply(frame, (1, 3, 8, 8)))
    assert [r["path"] for r in next(iter(chooser.report.values()))] == ["cpu"]


# -- a device whose driver refuses the kernels (tests/support/refusing_opencl.py: the real
# kernels plus a line no compiler accepts, built by the real driver) ---------------------------

def test_a_refused_build_names_the_device_and_the_logs_error_line_once(device, tiny_model,
                                                                      monkeypatch):
    from support.refusing_opencl import BROKEN_LINE, RefusingOpenCl

    from runtime.engine.backends import DeviceRefused
    from runtime.engine.backends import opencl as opencl_mod

    line = opencl_mod.kernel_source().count("\n") + 2  # the line appended after the kernels
    col = BROKEN_LINE.index("undeclared_thing") + 1
    builds = []
    real = opencl_mod.build_program
    monkeypatch.setattr(opencl_mod, "build_program", lambda *a: builds.append(a) or real(*a))
    b = RefusingOpenCl()
    name = next(d.name for d in b.devices() if d.id == device)
    mf = ModelFile("tiny", "fp32", tiny_model, "x", (1, 3, 32, 32))
    for storage in ("fp32", "fp16", "fp32"):
        with pytest.raises(DeviceRefused) as e:
            b.load(Variant(mf, "fp32", "opencl", device, 0, (("storage", storage),)))
        msg = str(e.value)
        assert e.value.device == device
        assert msg.startswith(f"opencl cannot run {tiny_model}: device {device} ({name}; ")
        # the build log's own line, once; not pyopencl's status thrice
        assert msg.endswith(f"cannot build the kernels: error: <source>:{line}:{col}: use of "
                            "undeclared identifier 'undeclared_thing'"), msg
        assert msg.count("error:") == 1 and "BUILD_PROGRAM_FAILURE" not in msg
    assert len(builds) == 2  # fp32 and fp16 tried once each: a refusal is remembered
    assert device in b.probe()
    with pytest.raises(DeviceRefused, match=f"^opencl: device {device} "):
        OpenClPreprocessor(b, device, Preprocess(), (1, 3, 8, 8))


def test_the_profiler_records_a_refusing_device_as_refused(device, tiny_model,
                                                           fast_profiler_cfg):
    from support.refusing_opencl import RefusingOpenCl

    from power.sensors import EstimatedMeter
    from runtime.choice.profiler import Profiler, model_files, plan, profile_all
    from runtime.choice.report import profile_table, refused_devices
    from runtime.config import BackendsConfig, ModelConfig

    b = RefusingOpenCl()
    models = model_files(ModelConfig(path=str(tiny_model)))
    cfg = BackendsConfig(threads=(1,))

    def profile(fresh=False):
        profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
        work = [w for w in plan([b], models, (1,), cfg) if w[2].device == device]
        return [profiler.profile(bk, d, v, fresh=fresh) for bk, d, v in work]

    first = profile()
    assert [p.status for p in first] == ["refused", "refused"]  # fp32 and fp16 storage
    for p in first:
        assert f"device {device} (" in p.error and "undeclared_thing" in p.error
        assert p.stage == "full" and p.runs == 0
    why, = refused_devices(first).values()
    assert refused_devices(first) == {("opencl", device): why}
    assert why.startswith(f"device {device} (") and "error: <source>:" in why
    table = profile_table(first, None, set(), width=400)
    assert f"refused: 2 opencl variants ({first[0].variant_id}, ...): {why}" in table
    assert "0 of 2 variants ran" in table
    # recorded: the next run reads the refusal back, built nothing, and says so
    again = profile()
    assert [(p.status, p.stage, p.error) for p in again] == [
        ("refused", "known-failure", p.error) for p in first]
    # a whole profiling run (every engine's variants) goes on past it
    everything = profile_all([b], models, (1,), cfg, Profiler(
        fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device"), fresh=True)
    assert {p.status for p in everything} == {"refused"}


def test_check_names_each_device_and_what_to_do_for_a_refusing_one(device, tmp_path,
                                                                   monkeypatch, capsys):
    from support.refusing_opencl import RefusingOpenCl

    from runtime import config as config_mod
    from runtime.device.cli import _check_engines
    from runtime.engine.backends import opencl as opencl_mod

    cfg = config_mod.load(None)
    _check_engines(cfg)
    err = capsys.readouterr().err
    assert f"opencl: {device} (" in err and "builds the kernels" in err
    monkeypatch.setattr(opencl_mod, "OpenClBackend", RefusingOpenCl)
    _check_engines(cfg)
    err = capsys.readouterr().err
    assert f"opencl: {device} REFUSED: device {device} (" in err
    assert "error: <source>:" in err and "what to do: its variants are left out" in err
    assert "pocl-opencl-icd" in err


STATUS = "clBuildProgram failed: BUILD_PROGRAM_FAILURE"


@pytest.mark.parametrize("message, want", [
    # pip's pocl 3.0 on a recent AMD EPYC (issue 32): the log's line, not the status thrice
    (f"{STATUS} - {STATUS} - {STATUS}\n\nBuild on <pyopencl.Device 'pthread-AMD EPYC' on "
     "'Portable Computing Language'>:\n\nerror: unknown target CPU 'generic'\nnote: valid "
     "target CPU values are: ...\n\n(options: -I /x/pyopencl/cl)",
     "error: unknown target CPU 'generic'"),
    # pocl names a fresh temporary file: the same failure reads the same on every build
    (f"{STATUS}\n\nBuild on <dev>:\n\nerror: /root/.cache/pocl/kcache/tempfile_YVzVdd.cl:1:43: "
     "use of undeclared identifier 'q'\n1 error generated.",
     "error: <source>:1:43: use of undeclared identifier 'q'"),
    # NVIDIA's compiler puts the place first
    (f"{STATUS}\n\nBuild on <dev>:\n\n<kernel>:3:5: error: expected ';'\n",
     "<kernel>:3:5: error: expected ';'"),
    # no log at all: the status, once
    (f"{STATUS} - {STATUS} - {STATUS}", STATUS),
    ("clCreateContext failed: DEVICE_NOT_AVAILABLE",) * 2,
    ("", "RuntimeError"),
])
def test_build_failure_is_the_logs_first_error_line(message, want):
    from runtime.engine.backends.opencl import build_failure

    assert build_failure(RuntimeError(message)) == want
