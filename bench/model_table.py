"""The per-variant table of models/README.md: accuracy (from the manifest, measured by
`models prepare` on the held-out synthetic test set) next to latency p50/p95 and energy per
inference measured now on this machine, one column group per backend (1 thread, fp32 engine
settings, each backend's default precision handling).

Usage: python bench/model_table.py [models/inspection] [--time-budget 1.0] > table.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from power.sensors import detect_meter
from runtime.choice.profiler import Profiler, plan
from runtime.config import (
    BackendsConfig,
    OnnxRuntimeConfig,
    OpenCvConfig,
    OpenVinoConfig,
    ProfilerConfig,
)
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover
from runtime.engine.manifest import load_manifest, model_files


def main() -> None:
    """Profile every variant on every backend and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=Path("models/inspection"))
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--device-profile", default="generic-x86")
    a = ap.parse_args()
    man = load_manifest(a.model)
    cfg = BackendsConfig(
        enabled=("onnxruntime", "openvino", "opencv"), threads=(1,),
        onnxruntime=OnnxRuntimeConfig(spinning=(False,), include_default=False),
        openvino=OpenVinoConfig(precision_hints=("f32",)),
        opencv=OpenCvConfig(engines=("new",), fp16_target=False))
    device = load_profile(a.device_profile)
    meter = detect_meter(Path("/"), device)
    prof = Profiler(ProfilerConfig(time_budget_s=a.time_budget, max_runs=5000,
                                   cache_dir="/tmp/edgerun-model-table"), meter, device.name)
    backends = discover(cfg)
    rows: dict[str, dict[str, str]] = {}
    for b, d, v in plan(backends, model_files(man), (1,), cfg):
        p = prof.profile(b, d, v, fresh=True)
        cell = (f"{p.p50_ms:.2f} / {p.p95_ms:.2f} ms, {p.energy_mj:.2f} mJ" if p.ok
                else "fails: " + (p.error or "")[:40])
        rows.setdefault(v.precision, {})[b.name] = cell
    names = [b.name for b in backends]
    print(f"Energy source: `{meter.source}` (device profile {device.name}); accuracy on "
          f"{man.eval_images} held-out synthetic images ({man.accuracy_basis}).\n")
    print("| variant | input | accuracy | " + " | ".join(
        f"{n} p50 / p95, energy" for n in names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for v in man.variants:
        shape = "x".join(str(x) for x in v.input_shape[2:])
        print(f"| {v.name} | {shape} | {v.accuracy:.4f} | "
              + " | ".join(rows.get(v.name, {}).get(n, "-") for n in names) + " |")


if __name__ == "__main__":
    main()
