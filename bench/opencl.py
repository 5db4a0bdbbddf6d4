"""OpenCL variants next to ONNX Runtime and OpenVINO on the same model, same run.

Profiles (edgerun's profiler: warm-up, p50/p95, energy per inference with its source) the
bundled model's fp32 forms on every OpenCL device (fp32 and fp16 storage), ORT (1 thread) and
OpenVINO (1 thread, f32), then prints the OpenCL kernel time split per op (device profiling
events) and the preprocessing kernel against the CPU path (cv2 resize + numpy).
On pocl (a CPU driver) OpenCL will not win: these numbers are the baseline a real OpenCL GPU
is compared with.

Usage: python bench/opencl.py [--model models/inspection] [--variant fp32] [--time-budget 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from power.sensors import detect_meter
from runtime.choice.profiler import Profiler, plan
from runtime.config import BackendsConfig, OnnxRuntimeConfig, OpenVinoConfig, ProfilerConfig
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover
from runtime.engine.manifest import load_manifest, model_files


def main() -> None:
    """Profile side by side, then split OpenCL time per op."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=Path("models/inspection"))
    ap.add_argument("--variant", action="append", help="manifest variant names (default: "
                    "every fp32 form)")
    ap.add_argument("--time-budget", type=float, default=1.0)
    a = ap.parse_args()
    man = load_manifest(a.model)
    forms = [f for f in model_files(man)
             if (a.variant and f.precision in a.variant)
             or (not a.variant and man.variant(f.precision).precision in ("fp32",
                                                                           "fp32-reduced"))]
    cfg = BackendsConfig(enabled=("onnxruntime", "openvino", "opencl"), threads=(1,),
                         onnxruntime=OnnxRuntimeConfig(spinning=(False,), include_default=False),
                         openvino=OpenVinoConfig(precision_hints=("f32",)))
    device = load_profile("generic-x86")
    meter = detect_meter(Path("/"), device)
    prof = Profiler(ProfilerConfig(time_budget_s=a.time_budget, max_runs=3000,
                                   cache_dir="/tmp/edgerun-bench-opencl"), meter, device.name)
    backends = discover(cfg)
    work = plan(backends, forms, (1,), cfg)
    rows = {}
    for b, d, v in work:
        p = prof.profile(b, d, v, fresh=True)
        rows[v.id] = p
    print(f"energy source: {meter.source} (device profile {device.name})\n")
    print(f"{'variant':<58} {'p50 ms':>8} {'p95 ms':>8} {'mJ':>8} {'vs ORT':>7}")
    for f in forms:
        ort_p = next((p for vid, p in rows.items() if vid.startswith(f"{f.name}/{f.precision}@"
                                                                       "onnxruntime")), None)
        for vid, p in rows.items():
            if not vid.startswith(f"{f.name}/{f.precision}@"):
                continue
            ratio = (p.p50_ms / ort_p.p50_ms) if (ort_p and p.ok) else float("nan")
            print(f"{vid:<58} {p.p50_ms:>8.3f} {p.p95_ms:>8.3f} {p.energy_mj:>8.3f} "
                  f"{ratio:>6.1f}x" if p.ok else f"{vid:<58} failed: {p.error}")
        print()

    from runtime.engine.backends.opencl import OpenClBackend, OpenClPreprocessor

    ocl = next((b for b in backends if b.name == "opencl"), None)
    if ocl is None:
        print("no OpenCL device: no kernel split")
        return
    assert isinstance(ocl, OpenClBackend)
    refused = ocl.probe()  # the split is of the first device whose driver builds the kernels
    dev = next((d.id for d in ocl.devices() if d.id not in refused), None)
    if dev is None:
        print(f"every OpenCL device refuses the kernels: no kernel split ({refused})")
        return
    f = forms[0]
    for storage in ("fp32", "fp16"):
        v = next(v for _, _, v in work if v.engine == "opencl" and v.model == f
                 and v.device == dev and v.option("storage") == storage)
        s = ocl.load(v, profile=True)
        x = np.zeros(f.input_shape, np.float32)
        for _ in range(5):
            s.infer(x)
        s.op_times_ns.clear()
        n = 50
        t0 = time.perf_counter()
        for _ in range(n):
            s.infer(x)
        wall = (time.perf_counter() - t0) / n * 1e3
        total = sum(s.op_times_ns.values()) / n / 1e6
        print(f"kernel time split, {v.id}: wall {wall:.3f} ms/inference, "
              f"kernels {total:.3f} ms ({total / wall:.0%}), rest = launches and copies")
        for op, ns in sorted(s.op_times_ns.items(), key=lambda kv: -kv[1]):
            print(f"  {op:<20} {ns / n / 1e6:8.3f} ms  {ns / n / 1e6 / total:6.1%}")
        s.close()
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    pre = OpenClPreprocessor(ocl, dev, man.preprocess, f.input_shape)
    for fn, name in ((pre, "OpenCL preprocess kernel"),
                     (lambda im: man.preprocess.apply(im, f.input_shape), "cv2 + numpy")):
        fn(frame)
        t0 = time.perf_counter()
        for _ in range(200):
            fn(frame)
        print(f"preprocess 640x480 -> {f.input_shape[2]}x{f.input_shape[3]}, {name:<26} "
              f"{(time.perf_counter() - t0) / 200 * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
