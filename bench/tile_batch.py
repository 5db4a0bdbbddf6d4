"""A tiled frame's inferences: one call per tile (what the pipeline does, runtime.engine.tiling.
infer_tiles) against one call with the tiles batched, on the bundled defect detector.

The bundled variants have a fixed batch of 1. This bench makes a dynamic-batch copy of each
(the input's and output's first dimension named, and every Reshape whose target shape starts
with a literal 1 told to copy the batch instead: 0), checks that the batched call gives the
per-tile outputs, and times both side by side (interleaved, same process, same session
options: one intra-op thread, as the profiler's t1 variants).

Usage: python bench/tile_batch.py [--tiles 9] [--rounds 300] [--variants fp32,int8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from models import bundled
from runtime.engine.manifest import load_manifest


def dynamic_batch(path: Path) -> bytes:
    """The model at `path` with a dynamic batch (see module doc), serialised."""
    m = onnx.load(str(path))
    for vi in (*m.graph.input, *m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del m.graph.value_info[:]  # intermediate shapes recorded with batch 1: inferred again
    inits = {i.name: i for i in m.graph.initializer}
    consts = {n.output[0]: n for n in m.graph.node if n.op_type == "Constant"}
    for n in m.graph.node:
        if n.op_type != "Reshape":
            continue
        name = n.input[1]
        if name in inits:
            shape = numpy_helper.to_array(inits[name]).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0  # copy the input's batch (Reshape's allowzero = 0)
                inits[name].CopyFrom(numpy_helper.from_array(shape, name))
        elif name in consts:
            attr = consts[name].attribute[0]
            shape = numpy_helper.to_array(attr.t).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0
                attr.t.CopyFrom(numpy_helper.from_array(shape, attr.t.name))
    return m.SerializeToString()


def session(model: str | bytes) -> ort.InferenceSession:
    """One intra-op thread, no spinning, all graph optimisations (the t1 variants')."""
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])


def main() -> None:
    """Print one line per variant: per-tile and batched ms per frame, their ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--variants", default="fp32,int8")
    a = ap.parse_args()
    man = load_manifest(bundled("defects"))
    rng = np.random.default_rng(0)
    print(f"bundled defects detector, {a.tiles} tiles per frame, {a.rounds} frames each way, "
          "interleaved; ms per frame (median, p95)")
    print(f"{'variant':8} {'per-tile calls':>22} {'one batched call':>22} {'ratio':>7} "
          f"{'max |diff|':>10}")
    for name in a.variants.split(","):
        v = man.variant(name)
        one = session(str(man.path(v)))
        many = session(dynamic_batch(man.path(v)))
        inp = v.input_name
        shape = tuple(v.input_shape)
        x = rng.random((a.tiles, *shape[1:]), dtype=np.float32)
        if str(one.get_inputs()[0].type) != "tensor(float)":
            raise SystemExit(f"{name}: input {one.get_inputs()[0].type}, not float")
        per = np.concatenate([one.run(None, {inp: x[i:i + 1]})[0] for i in range(a.tiles)])
        bat = many.run(None, {inp: x})[0]
        diff = float(np.max(np.abs(per - bat)))
        for _ in range(20):  # warm both
            one.run(None, {inp: x[:1]})
            many.run(None, {inp: x})
        t_per, t_bat = [], []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for i in range(a.tiles):
                one.run(None, {inp: x[i:i + 1]})
            t1 = time.perf_counter()
            many.run(None, {inp: x})
            t2 = time.perf_counter()
            t_per.append((t1 - t0) * 1e3)
            t_bat.append((t2 - t1) * 1e3)

        def fmt(ts: list[float]) -> str:
            return f"{statistics.median(ts):7.3f} ({np.percentile(ts, 95):7.3f})"

        print(f"{name:8} {fmt(t_per):>22} {fmt(t_bat):>22} "
              f"{statistics.median(t_per) / statistics.median(t_bat):6.2f}x {diff:10.2e}")


if __name__ == "__main__":
    main()
