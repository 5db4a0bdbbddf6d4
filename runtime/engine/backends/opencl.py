"""OpenCL backend (pyopencl): its own small-CNN executor and a frame-preprocessing kernel.

For devices with an OpenCL driver and nothing ONNX Runtime or OpenVINO can use (Mali, Adreno,
Vivante GPUs, some FPGAs); in CI it runs on pocl's CPU driver. The executor compiles an ONNX
graph of the ops in SUPPORTED into a fixed list of kernel launches: BatchNormalization is
folded into the Conv before it (or becomes a per-channel affine), activations that follow a
Conv are fused into it, Flatten/Reshape/Identity/Dropout alias buffers. Every tensor's buffer
is allocated once per session; between the input upload and the output download nothing
leaves the device. A graph with any other op is refused at load with the list of those ops,
and `variants()` never offers it.

Storage precision is a variant knob: `fp32`, or `fp16` (weights and activations stored as
half, math in fp32; vload_half/vstore_half are core OpenCL, so it runs without cl_khr_fp16
and halves memory traffic, which is what matters on small GPUs).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyopencl as cl
import pyopencl.cltypes as clt
from onnx import numpy_helper

from runtime.config.backends import BackendsConfig
from runtime.engine.backends import opencl_loader
from runtime.engine.backends.base import BackendError, Device, DeviceRefused, ModelFile, Variant

log = logging.getLogger(__name__)
# OpenCV, when it asks about OpenCL later, loads the loader pyopencl already has (opencl_loader.py)
log.debug("opencl: %s", opencl_loader.share())

SUPPORTED = frozenset({
    "Conv", "BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "MaxPool", "AveragePool", "GlobalAveragePool", "Add", "Mul", "Concat",
    "Flatten", "Reshape", "Gemm", "MatMul", "Softmax", "Identity", "Dropout", "Constant",
})
_ACT = {"Relu": 1, "Clip": 2, "LeakyRelu": 3, "Sigmoid": 4, "HardSigmoid": 5, "HardSwish": 6}
_KERNELS = Path(__file__).with_name("opencl_kernels.cl")
# What to do about a device that refuses the kernels (`edgerun check` and `edgerun profile`
# print it under the refusal; docs/install.md says what was measured)
REFUSED_HINT = ("its variants are left out; another OpenCL driver for the device may build "
                "them: where pip's pocl (pocl-binary-distribution) does not know the CPU "
                "(`unknown target CPU`), the distribution's `pocl-opencl-icd` may "
                "(docs/install.md, \"An OpenCL device that refuses the kernels\")")
# a compiler's name for the source it was handed: pocl writes it to a fresh temporary file, so
# the same failure would read differently on every build (and be grouped as many kinds)
_SOURCE_PATH = re.compile(r"\S+\.cl(?=:\d+:\d+:)")


class UnsupportedGraph(BackendError):
    """The graph uses ops this executor does not implement."""


def unsupported_ops(proto: onnx.ModelProto) -> list[str]:
    """Op types in the graph that the executor cannot run (sorted, unique)."""
    return sorted({n.op_type for n in proto.graph.node if n.op_type not in SUPPORTED
                   or n.domain not in ("", "ai.onnx")})


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def kernel_source() -> str:
    """edgerun's OpenCL kernels (opencl_kernels.cl), as the driver is handed them."""
    return _KERNELS.read_text()


def build_program(ctx, half: bool, source: str | None = None):
    """Compile the kernel source (edgerun's own unless `source` is given) for a context and
    storage precision."""
    text = kernel_source() if source is None else source
    return cl.Program(ctx, text).build(options=[f"-DSTORE_HALF={int(half)}", "-DOCB=4"])


def build_failure(e: Exception) -> str:
    """Why a build (or a context) failed, in one line: the first `error:` line of the build
    log that pyopencl's message carries (pocl: `error: unknown target CPU 'generic'`; NVIDIA:
    `<kernel>:3:5: error: ...`), else the status line with pyopencl's repeats of it dropped."""
    text = str(e).strip()
    for line in text.splitlines():
        if "error:" in line:
            return _SOURCE_PATH.sub("<source>", line.strip())[:300]
    first = text.splitlines()[0] if text else type(e).__name__
    return " - ".join(dict.fromkeys(first.split(" - ")))[:300]


def _driver(d) -> str:
    """A device's driver in words, e.g. "OpenCL 3.0 PoCL 3.0-rc2 Linux": what tells two pocls
    (the wheel's, the distribution's) apart."""
    return " ".join(d.platform.version.split(",")[0].split())


def _platforms() -> tuple[list, str]:
    """pyopencl's platforms, and why there are none ("" when there are)."""
    try:
        return cl.get_platforms(), ""
    except cl.Error as e:  # PLATFORM_NOT_FOUND_KHR: the loader found no ICD
        early = opencl_loader.foreign_loaders()
        if early:  # what the loader saw is not what pyopencl's wheel brings (opencl_loader.py)
            return [], (f"pyopencl's calls went to {', '.join(early)}, loaded before pyopencl's "
                        f"own loader (something asked OpenCV about OpenCL before edgerun's "
                        f"engines were imported), which lists no platform: {build_failure(e)}")
        return [], f"the OpenCL loader lists no platform (no ICD installed): {build_failure(e)}"


@dataclass
class _Step:
    op: str  # for the per-op time split
    kernel: str
    gsize: tuple[int, ...]
    lsize: tuple[int, ...] | None
    args: list[Any]


@dataclass
class _Tensor:
    shape: tuple[int, ...]
    buf: Any = None
    const: np.ndarray | None = None


@dataclass
class _Compiled:
    steps: list[_Step] = field(default_factory=list)
    tensors: dict[str, _Tensor] = field(default_factory=dict)


class OpenClSession:
    """A compiled graph on one OpenCL device."""

    def __init__(self, ctx, device, device_id: str, path: Path, input_name: str,
                 input_shape: tuple[int, ...], half: bool, profile: bool = False,
                 program: Any = None):
        self._cl = cl
        self.actual_device = f"{device_id} ({device.platform.name}: {device.name.strip()})"
        self._half = half
        self._dtype = np.float16 if half else np.float32
        props = cl.command_queue_properties.PROFILING_ENABLE if profile else 0
        self._queue = cl.CommandQueue(ctx, device, properties=props)
        self._ctx, self._device = ctx, device
        self._prog = program or build_program(ctx, half)
        self._kernels: dict[str, Any] = {}
        self._bufs: list[Any] = []  # every buffer, allocated once, released in close()
        try:
            proto = onnx.load(str(path))
        except Exception as e:
            raise BackendError("opencl", path, f"not a readable ONNX model: {e}") from e
        missing = unsupported_ops(proto)
        if missing:
            raise UnsupportedGraph("opencl", path, f"unsupported ops: {', '.join(missing)}")
        self._input_name = input_name
        self._g = _compile(self, proto, input_name, input_shape)
        out = proto.graph.output[0].name
        self._out = self._g.tensors[out]
        self._host_out = np.empty(self._out.shape, self._dtype)
        self.op_times_ns: dict[str, float] = {}
        self._profile = profile

    # -- helpers used by the compiler ------------------------------------------------------

    def kernel(self, name: str):
        """The compiled kernel called `name` (cached: pyopencl builds a new one per access)."""
        if name not in self._kernels:  # per session: kernel objects carry their arguments
            self._kernels[name] = cl.Kernel(self._prog, name)
        return self._kernels[name]

    def buffer(self, shape: tuple[int, ...], data: np.ndarray | None = None):
        """A device buffer for a tensor (initialised from `data` when given)."""
        cl = self._cl
        nbytes = max(1, int(np.prod(shape))) * np.dtype(self._dtype).itemsize
        if data is not None:
            host = np.ascontiguousarray(data, dtype=self._dtype).reshape(-1)
            buf = cl.Buffer(self._ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                            hostbuf=host)
        else:
            buf = cl.Buffer(self._ctx, cl.mem_flags.READ_WRITE, size=nbytes)
        self._bufs.append(buf)
        return buf

    def max_wg(self) -> int:
        """The device's largest work-group."""
        return int(self._device.max_work_group_size)

    # -- running ---------------------------------------------------------------------------

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Upload the input, run every step on the device, download the output."""
        cl = self._cl
        inp = self._g.tensors[self._input_name]
        host = np.ascontiguousarray(batch, dtype=self._dtype)
        if host.shape != inp.shape:
            raise ValueError(f"input shape {host.shape} != compiled {inp.shape}")
        cl.enqueue_copy(self._queue, inp.buf, host, is_blocking=False)
        events = []
        for s in self._g.steps:
            ev = self.kernel(s.kernel)(self._queue, s.gsize, s.lsize, *s.args)
            if self._profile:
                events.append((s.op, ev))
        cl.enqueue_copy(self._queue, self._host_out, self._out.buf, is_blocking=True)
        for op, ev in events:
            self.op_times_ns[op] = self.op_times_ns.get(op, 0.0) + (
                ev.profile.end - ev.profile.start)
        return self._host_out.astype(np.float32)

    def close(self) -> None:
        """Release buffers and the queue."""
        self._queue.finish()
        for buf in self._bufs:
            buf.release()
        self._bufs.clear()


def _compile(s: OpenClSession, proto: onnx.ModelProto, input_name: str,
             input_shape: tuple[int, ...]) -> _Compiled:
    """ONNX graph -> kernel launches with every buffer allocated (see module docstring)."""
    g = _Compiled()
    T = g.tensors
    for init in proto.graph.initializer:
        arr = numpy_helper.to_array(init)
        T[init.name] = _Tensor(arr.shape, const=arr)
    for n in proto.graph.node:
        if n.op_type == "Constant":
            T[n.output[0]] = _Tensor((), const=numpy_helper.to_array(_attrs(n)["value"]))
            T[n.output[0]].shape = T[n.output[0]].const.shape
    T[input_name] = _Tensor(tuple(input_shape), buf=s.buffer(tuple(input_shape)))
    consumers: dict[str, int] = {}
    for n in proto.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    outputs = {o.name for o in proto.graph.output}
    nodes = [n for n in proto.graph.node if n.op_type != "Constant"]
    fused: set[int] = set()

    def dev(name: str):
        t = T[name]
        if t.buf is None:
            t.buf = s.buffer(t.shape, t.const)
        return t.buf

    def new(name: str, shape: tuple[int, ...]):
        T[name] = _Tensor(tuple(int(d) for d in shape), buf=s.buffer(tuple(shape)))
        return T[name].buf

    def single_next(i: int, out: str) -> tuple[int, onnx.NodeProto] | None:
        if consumers.get(out, 0) != 1 or out in outputs or i + 1 >= len(nodes):
            return None
        nxt = nodes[i + 1]
        return (i + 1, nxt) if nxt.input and nxt.input[0] == out else None

    for i, n in enumerate(nodes):
        if i in fused:
            continue
        op, a = n.op_type, _attrs(n)
        if op in _VIEWS:
            _view(g, n, a, dev)
        elif op in ("Conv", "BatchNormalization"):
            _conv(s, g, n, a, nodes, i, single_next, fused, dev, new)
        elif op in _ACT:
            _act(s, g, n, a, dev, new)
        elif (emit := _EMIT.get(op)) is not None:
            emit(s, g, n, a, dev, new)
        else:  # pragma: no cover - unsupported_ops() refused it already
            raise UnsupportedGraph("opencl", n.name, f"unsupported op {op}")
    return g


# ops that only rename or reshape a tensor: no kernel, the same buffer (or constant)
_VIEWS = ("Identity", "Dropout", "Flatten", "Reshape")


def _view(g: _Compiled, n: onnx.NodeProto, a: dict, dev) -> None:
    """Identity, Dropout, Flatten, Reshape: the output shares the input's buffer."""
    T = g.tensors
    op = n.op_type
    src = T[n.input[0]]
    if op == "Flatten":
        ax = a.get("axis", 1) % max(1, len(src.shape))
        shape = (int(np.prod(src.shape[:ax])), int(np.prod(src.shape[ax:])))
    elif op == "Reshape":
        want = [int(d) for d in T[n.input[1]].const]
        want = [src.shape[k] if d == 0 else d for k, d in enumerate(want)]
        if -1 in want:
            known = int(np.prod([d for d in want if d != -1]))
            want[want.index(-1)] = int(np.prod(src.shape)) // known
        shape = tuple(want)
    else:
        shape = src.shape
    if src.buf is None and src.const is not None:
        T[n.output[0]] = _Tensor(shape, const=src.const.reshape(shape))
    else:
        T[n.output[0]] = _Tensor(shape, buf=dev(n.input[0]))


def _act(s, g, n, a, dev, new) -> None:
    """An elementwise activation (_ACT) as one act_map launch."""
    T = g.tensors
    x = T[n.input[0]]
    count = int(np.prod(x.shape))
    p1, p2 = _act_params(n, a, T)
    y = new(n.output[0], x.shape)
    g.steps.append(_Step(n.op_type, "act_map", (count,), None,
                         [dev(n.input[0]), y, np.int32(count), np.int32(_ACT[n.op_type]),
                          np.float32(p1), np.float32(p2)]))


def _global_avg(s, g, n, a, dev, new) -> None:
    """GlobalAveragePool: one work-group per (image, channel), a local-memory reduction."""
    T = g.tensors
    N, C, H, W = T[n.input[0]].shape
    ls = 1 << int(math.log2(max(1, min(256, s.max_wg(), H * W))))
    y = new(n.output[0], (N, C, 1, 1))
    g.steps.append(_Step(n.op_type, "global_avg", (N * C * ls,), (ls,),
                         [dev(n.input[0]), y, np.int32(H * W),
                          s._cl.LocalMemory(4 * ls)]))


def _concat(s, g, n, a, dev, new) -> None:
    """Concat: one copy launch per input into its slice of the output."""
    T = g.tensors
    shapes = [T[x].shape for x in n.input]
    ax = a["axis"] % len(shapes[0])
    out_shape = list(shapes[0])
    out_shape[ax] = sum(sh[ax] for sh in shapes)
    y = new(n.output[0], tuple(out_shape))
    outer = int(np.prod(out_shape[:ax]))
    total = int(np.prod(out_shape[ax:]))
    off = 0
    for name, sh in zip(n.input, shapes, strict=True):
        inner = int(np.prod(sh[ax:]))
        g.steps.append(_Step(n.op_type, "concat_copy", (outer * inner,), None,
                             [dev(name), y, np.int32(outer), np.int32(inner),
                              np.int32(total), np.int32(off)]))
        off += inner


def _softmax(s, g, n, a, dev, new) -> None:
    """Softmax over the last axis, one launch per row."""
    T = g.tensors
    shape = T[n.input[0]].shape
    ax = a.get("axis", -1) % len(shape)
    if ax != len(shape) - 1:
        raise UnsupportedGraph("opencl", n.name, "Softmax only over the last axis")
    cols = shape[-1]
    rows = int(np.prod(shape[:-1]))
    y = new(n.output[0], shape)
    g.steps.append(_Step(n.op_type, "softmax", (rows,), None,
                         [dev(n.input[0]), y, np.int32(rows), np.int32(cols)]))


def _act_params(n: onnx.NodeProto, a: dict, T: dict) -> tuple[float, float]:
    op = n.op_type
    if op == "Clip":
        lo = a.get("min", -np.inf)
        hi = a.get("max", np.inf)
        if len(n.input) > 1 and n.input[1]:
            lo = float(T[n.input[1]].const)
        if len(n.input) > 2 and n.input[2]:
            hi = float(T[n.input[2]].const)
        return float(max(lo, -3.0e38)), float(min(hi, 3.0e38))
    if op == "LeakyRelu":
        return a.get("alpha", 0.01), 0.0
    if op == "HardSigmoid":
        return a.get("alpha", 0.2), a.get("beta", 0.5)
    return 0.0, 0.0


def _pads(a: dict, nd: int = 2) -> tuple[int, int, int, int]:
    p = list(a.get("pads", [0] * (2 * nd)))
    return p[0], p[1], p[2], p[3]  # top, left, bottom, right


def _out_dim(size: int, k: int, s: int, p0: int, p1: int, d: int, ceil: bool = False) -> int:
    span = size + p0 + p1 - d * (k - 1) - 1
    return (math.ceil(span / s) if ceil else span // s) + 1


def _auto_pad(a: dict, H: int, W: int, KH: int, KW: int, SH: int, SW: int, DH: int, DW: int):
    mode = a.get("auto_pad", b"NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, st, d in ((H, KH, SH, DH), (W, KW, SW, DW)):
            out = math.ceil(size / st)
            total = max(0, (out - 1) * st + d * (k - 1) + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if mode == "SAME_UPPER" else (big, small))
        return pads[0][0], pads[1][0], pads[0][1], pads[1][1]
    if mode == "VALID":
        return 0, 0, 0, 0
    return _pads(a)


def _conv(s, g, n, a, nodes, i, single_next, fused, dev, new) -> int:
    T = g.tensors
    op = n.op_type
    x = T[n.input[0]]
    N, C, H, W = x.shape
    if op == "BatchNormalization":  # standalone: a depthwise 1x1 affine
        sc, bb, mean, var = (T[k].const.astype(np.float64) for k in n.input[1:5])
        k = sc / np.sqrt(var + a.get("epsilon", 1e-5))
        w = k.reshape(C, 1, 1, 1)
        b = bb - mean * k
        ca = {"group": C}
        OC, KH, KW = C, 1, 1
    else:
        w = T[n.input[1]].const.astype(np.float64)
        OC, _, KH, KW = w.shape
        b = (T[n.input[2]].const.astype(np.float64) if len(n.input) > 2 and n.input[2]
             else np.zeros(OC))
        ca = a
    out = n.output[0]
    nxt = single_next(i, out)
    if op == "Conv" and nxt and nxt[1].op_type == "BatchNormalization":
        bn = nxt[1]
        sc, bb, mean, var = (T[k].const.astype(np.float64) for k in bn.input[1:5])
        k = sc / np.sqrt(var + _attrs(bn).get("epsilon", 1e-5))
        w = w * k.reshape(-1, 1, 1, 1)
        b = (b - mean) * k + bb
        fused.add(nxt[0])
        out = bn.output[0]
        i = nxt[0]
        nxt = single_next(i, out)
    act, p1, p2 = 0, 0.0, 0.0
    if nxt and nxt[1].op_type in _ACT:
        act = _ACT[nxt[1].op_type]
        p1, p2 = _act_params(nxt[1], _attrs(nxt[1]), T)
        fused.add(nxt[0])
        out = nxt[1].output[0]
    G = ca.get("group", 1)
    SH, SW = ca.get("strides", [1, 1])
    DH, DW = ca.get("dilations", [1, 1])
    PT, PL, PB, PR = _auto_pad(ca, H, W, KH, KW, SH, SW, DH, DW)
    OH, OW = _out_dim(H, KH, SH, PT, PB, DH), _out_dim(W, KW, SW, PL, PR, DW)
    y = new(out, (N, OC, OH, OW))
    wb, bbuf = s.buffer(w.shape, w.astype(np.float32)), s.buffer(b.shape, b.astype(np.float32))
    tail = [np.int32(act), np.float32(p1), np.float32(p2)]
    i32 = np.int32
    if G == C == OC:
        g.steps.append(_Step("Conv(dw)", "conv_dw", (OW, OH, N * C), None,
                             [dev(n.input[0]), wb, bbuf, y, i32(C), i32(H), i32(W), i32(OH),
                              i32(OW), i32(KH), i32(KW), i32(SH), i32(SW), i32(PT), i32(PL),
                              i32(DH), i32(DW), *tail]))
    elif G == 1 and KH == KW == 1 and SH == SW == 1 and PT == PL == PB == PR == 0:
        P = H * W
        ts = 8
        g.steps.append(_Step("Conv(1x1)", "conv_1x1", (-(-P // ts) * ts, -(-OC // ts) * ts, N),
                             (ts, ts, 1), [dev(n.input[0]), wb, bbuf, y, i32(C), i32(P),
                                           i32(OC), *tail]))
    else:
        blocks = -(-(OC // G) // 4)
        g.steps.append(_Step("Conv", "conv2d", (OW, OH, N * G * blocks), None,
                             [dev(n.input[0]), wb, bbuf, y, i32(C), i32(H), i32(W), i32(OC),
                              i32(OH), i32(OW), i32(KH), i32(KW), i32(SH), i32(SW), i32(PT),
                              i32(PL), i32(DH), i32(DW), i32(G), *tail]))
    return i


def _pool(s, g, n, a, dev, new) -> None:
    T = g.tensors
    N, C, H, W = T[n.input[0]].shape
    KH, KW = a["kernel_shape"]
    SH, SW = a.get("strides", [1, 1])
    DH, DW = a.get("dilations", [1, 1])
    PT, PL, PB, PR = _auto_pad(a, H, W, KH, KW, SH, SW, DH, DW)
    ceil = bool(a.get("ceil_mode", 0))
    OH, OW = _out_dim(H, KH, SH, PT, PB, DH, ceil), _out_dim(W, KW, SW, PL, PR, DW, ceil)
    y = new(n.output[0], (N, C, OH, OW))
    mode = 0 if n.op_type == "MaxPool" else 1
    i32 = np.int32
    g.steps.append(_Step(n.op_type, "pool2d", (OW, OH, N * C), None,
                         [dev(n.input[0]), y, i32(H), i32(W), i32(OH), i32(OW), i32(KH),
                          i32(KW), i32(SH), i32(SW), i32(PT), i32(PL), i32(PB), i32(PR),
                          i32(DH), i32(DW), i32(mode),
                          i32(a.get("count_include_pad", 0))]))


def _strides4(shape: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    """Element strides of `shape` broadcast to the 4-D `out` (0 on broadcast axes)."""
    sh = (1,) * (4 - len(shape)) + tuple(shape)
    st = [0] * 4
    acc = 1
    for k in range(3, -1, -1):
        st[k] = 0 if sh[k] == 1 and out[k] != 1 else acc
        acc *= sh[k]
    return np.array(st, np.int32)


def _binary(s, g, n, dev, new, op: int) -> None:
    T = g.tensors
    a_shape, b_shape = T[n.input[0]].shape, T[n.input[1]].shape
    out = tuple(np.broadcast_shapes(a_shape, b_shape))
    if len(out) > 4:
        raise UnsupportedGraph("opencl", n.name, f"{n.op_type} over {len(out)} dims (max 4)")
    o4 = (1,) * (4 - len(out)) + out
    y = new(n.output[0], out)
    count = int(np.prod(out))
    sx, sz = _strides4(a_shape, o4), _strides4(b_shape, o4)
    g.steps.append(_Step(n.op_type, "binary", (count,), None,
                         [dev(n.input[0]), dev(n.input[1]), y, np.int32(count),
                          np.int32(o4[1]), np.int32(o4[2]), np.int32(o4[3]),
                          clt.make_int4(*sx), clt.make_int4(*sz), np.int32(op), np.int32(0)]))


def _gemm(s, g, n, a, dev, new) -> None:
    T = g.tensors
    A, B = T[n.input[0]], T[n.input[1]]
    if len(A.shape) != 2 or len(B.shape) != 2:
        raise UnsupportedGraph("opencl", n.name, f"{n.op_type} needs 2-D inputs, got "
                               f"{A.shape} x {B.shape}")
    ta, tb = a.get("transA", 0), a.get("transB", 0)
    M, K = (A.shape[1], A.shape[0]) if ta else A.shape
    N = B.shape[0] if tb else B.shape[1]
    y = new(n.output[0], (M, N))
    cmode, cbuf = 0, dev(n.input[0])
    if n.op_type == "Gemm" and len(n.input) > 2 and n.input[2]:
        c = T[n.input[2]]
        cmode = 2 if int(np.prod(c.shape)) == M * N and M > 1 else 1
        cbuf = dev(n.input[2])
    g.steps.append(_Step(n.op_type, "gemm", (N, M), None,
                         [dev(n.input[0]), dev(n.input[1]), cbuf, y, np.int32(M), np.int32(N),
                          np.int32(K), np.int32(ta), np.int32(tb),
                          np.float32(a.get("alpha", 1.0)), np.float32(a.get("beta", 1.0)),
                          np.int32(cmode)]))


# the other ops' emitters, by op type (Conv/BatchNormalization fuse with what follows, the
# views and activations are above)
_EMIT = {
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _global_avg,
    "Add": lambda s, g, n, a, dev, new: _binary(s, g, n, dev, new, 0),
    "Mul": lambda s, g, n, a, dev, new: _binary(s, g, n, dev, new, 1),
    "Concat": _concat,
    "Gemm": _gemm,
    "MatMul": _gemm,
    "Softmax": _softmax,
}


class OpenClBackend:
    """OpenCL through pyopencl, with edgerun's own kernels."""

    name = "opencl"
    config_class = None  # no knobs of its own: no [backends.opencl]
    refused_hint = REFUSED_HINT

    def __init__(self, kernel_source: str | None = None) -> None:
        self._source = kernel_source  # None: opencl_kernels.cl (tests hand in a broken one)
        self._devices: dict[str, Any] = {}
        self._contexts: dict[str, Any] = {}
        self._programs: dict[tuple[str, bool], Any] = {}
        # (device, fp16 storage) -> why its driver refused the kernels: asked once per backend
        self._refused: dict[tuple[str, bool], str] = {}
        platforms, self.no_device = _platforms()  # no_device: why none, for discovery's report
        for p in platforms:
            try:
                devs = p.get_devices()
            except cl.Error as e:
                self.no_device = f"platform {p.name!r} lists no device: {build_failure(e)}"
                continue
            for d in devs:
                kind = "GPU" if d.type & cl.device_type.GPU else (
                    "CPU" if d.type & cl.device_type.CPU else "ACCEL")
                idx = sum(1 for k in self._devices if k.startswith(kind + "."))
                self._devices[f"{kind}.{idx}"] = d
        if self._devices:
            self.no_device = ""

    def devices(self) -> list[Device]:
        """Every OpenCL device with its limits; empty when no platform is installed."""
        out = []
        for did, d in self._devices.items():
            out.append(Device(self.name, did, d.name.strip(), {
                "platform": d.platform.name, "driver": _driver(d), "version": d.version,
                "compute_units": str(d.max_compute_units),
                "global_mem_mb": str(d.global_mem_size >> 20),
                "local_mem_kb": str(d.local_mem_size >> 10),
                "max_work_group": str(d.max_work_group_size),
                "fp16": str("cl_khr_fp16" in d.extensions).lower()}))
        return out

    def variants(self, model: ModelFile, cfg: BackendsConfig,
                 threads: tuple[int, ...]) -> list[Variant]:
        """fp32 and fp16 storage per device, for graphs the executor supports."""
        try:
            missing = unsupported_ops(onnx.load(str(model.path), load_external_data=False))
        except Exception:  # unreadable: offered anyway, so load() reports why like any engine
            missing = []
        if missing:
            log.debug("opencl: %s not offered (unsupported ops: %s)", model.path,
                      ", ".join(missing))
            return []
        return [Variant(model, model.precision, self.name, did, 0, (("storage", st),))
                for did in self._devices for st in ("fp32", "fp16")]

    def context(self, device_id: str):
        """One context per device, shared by its sessions."""
        if device_id not in self._contexts:
            self._contexts[device_id] = cl.Context([self._devices[device_id]])
        return self._contexts[device_id]

    def program(self, device_id: str, half: bool):
        """The kernels built once per device and storage precision. A device whose driver
        refuses them raises DeviceRefused (naming the device and the build log's `error:`
        line), at once on later calls: the build is not tried again."""
        key = (device_id, half)
        if key not in self._programs and key not in self._refused:
            try:
                self._programs[key] = build_program(self.context(device_id), half,
                                                    self._source)
            except cl.Error as e:
                d = self._devices[device_id]
                driver = _driver(d)
                # the same words for both storage precisions (the log line says what differs):
                # a device's refusal is then one kind of failure, not two
                self._refused[key] = (f"device {device_id} ({d.name.strip()}; {driver}) cannot "
                                      f"build the kernels: {build_failure(e)}")
                log.debug("opencl: %s", self._refused[key])
        if key in self._refused:
            raise DeviceRefused(self.name, "", device_id, self._refused[key])
        return self._programs[key]

    def probe(self) -> dict[str, str]:
        """Build the kernels (fp32 storage) on every device; the devices whose driver refuses
        them, with why (what `edgerun check` reports)."""
        out = {}
        for did in self._devices:
            try:
                self.program(did, False)
            except DeviceRefused as e:
                out[did] = e.cause
        return out

    def load(self, variant: Variant, profile: bool = False) -> OpenClSession:
        """Compile the graph for the variant's device and storage precision."""
        m = variant.model
        if variant.device not in self._devices:
            raise BackendError(self.name, m.path, f"no OpenCL device {variant.device}")
        half = variant.option("storage") == "fp16"
        try:
            program = self.program(variant.device, half)
        except DeviceRefused as e:  # the same refusal, now naming the model it stops
            raise DeviceRefused(self.name, m.path, e.device, e.cause) from e
        try:
            return OpenClSession(self.context(variant.device), self._devices[variant.device],
                                 variant.device, m.path, m.input_name, m.input_shape, half,
                                 profile, program)
        except BackendError:
            raise
        except Exception as e:  # build logs, out-of-resources, malformed graphs
            raise BackendError(self.name, m.path, build_failure(e)) from e


class OpenClPreprocessor:
    """The manifest's preprocessing as one kernel: uint8 HxWx3 BGR frame -> NCHW tensor."""

    def __init__(self, backend: OpenClBackend, device_id: str, pre, input_shape: tuple[int, ...],
                 half: bool = False):
        if pre.layout != "NCHW" or pre.resize not in ("bilinear", "nearest"):
            raise ValueError("the OpenCL preprocessor does NCHW with bilinear or nearest resize")
        self._cl = cl
        ctx = backend.context(device_id)
        self._queue = cl.CommandQueue(ctx)
        self._kernel = cl.Kernel(backend.program(device_id, half), "preprocess")
        self._ctx = ctx
        self._shape = input_shape
        self._dtype = np.float16 if half else np.float32
        self._out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE,
                              size=int(np.prod(input_shape)) * np.dtype(self._dtype).itemsize)
        self._src = None
        self._src_shape: tuple[int, ...] = ()
        # The kernel swaps B and R first, so mean and std apply in the model's channel order.
        mean = np.asarray(pre.mean, np.float32)
        inv = 1.0 / np.asarray(pre.std, np.float32)
        self._args = (np.int32(0 if pre.resize == "bilinear" else 1),
                      np.int32(pre.colour == "RGB"), np.float32(pre.scale),
                      clt.make_float3(*mean), clt.make_float3(*inv))
        self._host = np.empty(input_shape, self._dtype)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """Preprocess one frame on the device and return the tensor (float32)."""
        cl = self._cl
        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        if frame.shape != self._src_shape:
            self._src = cl.Buffer(self._ctx, cl.mem_flags.READ_ONLY, size=frame.nbytes)
            self._src_shape = frame.shape
        H, W = frame.shape[:2]
        OH, OW = self._shape[2], self._shape[3]
        cl.enqueue_copy(self._queue, self._src, frame, is_blocking=False)
        self._kernel(self._queue, (OW, OH), None, self._src, self._out, np.int32(H),
                     np.int32(W), np.int32(OH), np.int32(OW), *self._args)
        cl.enqueue_copy(self._queue, self._host, self._out, is_blocking=True)
        return self._host.astype(np.float32)
