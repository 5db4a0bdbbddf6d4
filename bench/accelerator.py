"""The accelerator check: every device and meter, CPU and GPU variants billed what they draw.

Lists every backend's devices and every power meter (the host's: RAPL/hwmon/estimated; each
NVIDIA GPU's through NVML), then profiles two models with edgerun's profiler on the CPU engines
(ORT and OpenVINO, 1 thread and every core) and on every OpenCL device (fp32 and fp16 storage):
the bundled `inspection` model (~1 ms) and a conv net built here (~10-100 ms on one CPU core).
A variant on an accelerator is billed host CPU + the GPU (NVML's energy counter above its idle
floor where a meter covers it, else the device profile's [[accelerators]] busy power, labelled
estimated; neither: left out, saying why). Prints the selector's choice at a tight and a loose
latency target and the energy ratio GPU/CPU (best variant of each) per model. Side by side in
one run; bounded (about 1-3 minutes on 2 cores, well under 8 on a GPU server).

Per variant it prints the back-to-back energy, the energy at 5 and 20 Hz (back to back +
the device's measured gap power x the gap, runtime/choice/at_rate.py) and the meter's
resolution, then the choice at each target at each rate.

`--fake-gpu` (no GPU here): the OpenCL device (pocl on the CPU) stands in for a GPU behind
the tests' fake NVML (counter ticking every 100 ms, 40 W above idle held for 5 s after a
kernel): it checks the plumbing, not a GPU's numbers. The real-GPU run is still to do.

Usage: python bench/accelerator.py [--profile NAME] [--time-budget 0.5] [--json OUT]
       [--fake-gpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from power.accelerators import AcceleratorPower, on_host
from power.nvml import gpu_meters
from power.sensors import detect_meter
from runtime.choice import at_rate
from runtime.choice.profiler import Profiler, model_files, plan
from runtime.choice.selector import Constraints, NoVariantError, select
from runtime.config import (
    BackendsConfig,
    ModelConfig,
    OnnxRuntimeConfig,
    OpenVinoConfig,
    ProfilerConfig,
)
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover

REPO = Path(__file__).resolve().parents[1]


def conv_net(path: Path, hw: int = 224, width: int = 32, blocks: int = 4) -> Path:
    """A plain conv net of ops every engine and the OpenCL executor run: `blocks` x (3x3 conv,
    relu), a max pool every block, then global pooling and a classifier. At 224 px and width
    32 it takes ~10-60 ms a frame on one x86 core."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32),
            name)

    inits, nodes, x, cin = [], [], "x", 3
    for i in range(blocks):
        cout = width * (2 ** min(i, 2))
        inits += [w(f"w{i}a", (cout, cin, 3, 3)), w(f"w{i}b", (cout, cout, 3, 3)),
                  numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}a", f"b{i}"], [f"c{i}a"], pads=[1] * 4),
                  helper.make_node("Relu", [f"c{i}a"], [f"r{i}a"]),
                  helper.make_node("Conv", [f"r{i}a", f"w{i}b", f"b{i}"], [f"c{i}b"],
                                   pads=[1] * 4),
                  helper.make_node("Relu", [f"c{i}b"], [f"r{i}b"]),
                  helper.make_node("MaxPool", [f"r{i}b"], [f"p{i}"], kernel_shape=[2, 2],
                                   strides=[2, 2])]
        x, cin = f"p{i}", cout
    inits += [w("fcw", (10, cin)), numpy_helper.from_array(np.zeros(10, np.float32), "fcb")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _fake_gpu():
    """(fake pynvml, fake GPU) from the tests' support (the hardware boundary)."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.fake_gpu import FakeGpu, FakeNvml

    gpu = FakeGpu(idle_w=20.0, busy_w=65.0, hold_w=60.0, hold_s=5.0, tick_s=0.1)
    return FakeNvml([gpu]), gpu


def _on_fake(backend, gpu):
    """`backend` whose sessions run as kernels of the fake GPU (pocl does the work)."""
    from support.fake_gpu import GpuSession

    class OnFake(type(backend)):
        def load(self, variant):
            return GpuSession(backend.load(variant), gpu)

    b = OnFake.__new__(OnFake)
    b.__dict__.update(backend.__dict__)
    return b


def main() -> int:
    """List devices and meters, profile both models everywhere, print choices and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="", help="device profile (default: x86-nvidia-gpu "
                    "when NVML finds a GPU, else generic-x86)")
    ap.add_argument("--time-budget", type=float, default=0.5, help="seconds per variant")
    ap.add_argument("--json", type=Path, help="also write every profile here")
    ap.add_argument("--fake-gpu", action="store_true", help="pocl's OpenCL device behind the "
                    "tests' fake NVML (module doc): the plumbing, not a GPU's numbers")
    a = ap.parse_args()
    t_start = time.monotonic()
    fake = _fake_gpu() if a.fake_gpu else None
    gpus = gpu_meters(fake[0]) if fake else gpu_meters()
    device = load_profile(a.profile or ("x86-nvidia-gpu" if gpus else "generic-x86"))
    host = detect_meter(Path("/"), device)
    cfg = BackendsConfig(enabled=("onnxruntime", "openvino", "opencl"),
                         onnxruntime=OnnxRuntimeConfig(spinning=(False,), include_default=False),
                         openvino=OpenVinoConfig(precision_hints=("f32",)))
    backends = discover(cfg)
    accelerators = device.accelerators
    if fake:
        backends = [_on_fake(b, fake[1]) if b.name == "opencl" else b for b in backends]
        accelerators = (AcceleratorPower("NVIDIA", "GPU", 20.0, 65.0, "assumed"),)
    print(f"device profile: {device.name}; host meter: {host.source} ({host.where})")
    for g in gpus:
        print(f"GPU meter: nvml: {g.where}; {g.resolution().describe()}")
    if not gpus:
        print("GPU meter: none (no NVML or no NVIDIA GPU): GPU variants are billed the "
              "profile's [[accelerators]] busy power, or left out")
    for acc in device.accelerators:
        print(f"accelerator model: '{acc.match}' {acc.kind} {acc.idle_w:g} W idle / "
              f"{acc.active_w:g} W busy ({acc.basis})")
    for b in backends:
        for d in b.devices():
            extra = ", ".join(f"{k}={v}" for k, v in sorted(d.details.items()))
            print(f"device: {b.name}:{d.id} {d.name} [{extra}]")
    import os

    threads = tuple(sorted({1, os.cpu_count() or 1}))
    tmp = Path(tempfile.mkdtemp(prefix="edgerun-accel-"))
    models = {"inspection (bundled)": ModelConfig(path=str(REPO / "models" / "inspection")),
              "convnet 224 px (built here)": ModelConfig(path=str(conv_net(tmp / "conv.onnx")))}
    prof = Profiler(ProfilerConfig(time_budget_s=a.time_budget, min_runs=10, max_runs=2000,
                                   cache_dir=str(tmp / "cache")), host, device.name,
                    active_w_per_core=device.power.active_w_per_core,
                    accelerators=accelerators, gpu_meters=gpus)
    out = []
    for label, mcfg in models.items():
        forms = [f for f in model_files(mcfg) if f.precision == "fp32"]
        rows = [prof.profile(b, d, v, fresh=True) for b, d, v in plan(backends, forms,
                                                                     threads, cfg)]
        print(f"\n== {label}")
        print(f"{'variant':<58} {'device':<34} {'p95 ms':>8} {'mJ b2b':>9} {'@5 Hz':>9} "
              f"{'@20 Hz':>9}  source; gap power; meter error")
        for p in sorted(rows, key=lambda p: (not p.ok, p.energy_mj)):
            if p.ok:
                gap = (f"{p.gap_w:.1f} W ({p.gap_source})" if p.gap_w == p.gap_w
                       else "host: idles between frames" if on_host(p.actual_device)
                       else "gap power unknown")
                q = f"{p.energy_q:.1%}" if p.energy_q == p.energy_q else "n/a"
                print(f"{p.variant_id:<58} {p.actual_device[:34]:<34} {p.p95_ms:>8.2f} "
                      f"{p.energy_mj:>9.3f} {at_rate.per_inference_mj(p, 5.0):>9.3f} "
                      f"{at_rate.per_inference_mj(p, 20.0):>9.3f}  {p.energy_source}; {gap}; {q}")
            else:
                print(f"{p.variant_id:<58} left out: {p.error}")
        ok = [p for p in rows if p.ok]
        cpu = [p for p in ok if on_host(p.actual_device)]
        gpu = [p for p in ok if not on_host(p.actual_device)]
        fastest = min((p.p95_ms for p in ok), default=0.0)
        for name, target in (("tight", fastest * 1.2), ("loose", fastest * 10)):
            for rate in (0.0, 5.0, 20.0):
                at = f"{rate:g} Hz" if rate else "back to back"
                try:
                    c = select(rows, Constraints(latency_ms=max(target, 0.01), rate_hz=rate))
                    print(f"choice at {name} target {target:.2f} ms, {at}: "
                          f"{c.profile.variant_id} ({c.profile.actual_device}): {c.reason}")
                except NoVariantError as e:
                    print(f"choice at {name} target {target:.2f} ms, {at}: none ({e})")
        if cpu and gpu:
            best_c = min(cpu, key=lambda p: p.energy_mj)
            best_g = min(gpu, key=lambda p: p.energy_mj)
            print(f"energy GPU/CPU (best of each): {best_g.energy_mj / best_c.energy_mj:.2f}x "
                  f"({best_g.energy_mj:.3f} mJ {best_g.variant_id} vs {best_c.energy_mj:.3f} mJ "
                  f"{best_c.variant_id})")
        else:
            print("energy GPU/CPU: n/a (no accelerator variant ran with a known energy)")
        out += [{"bench_model": label, **asdict(p)} for p in rows]
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    print(f"\ntook {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
